/*
 * Stand-in for the HIP runtime's virtual-memory calls (libamdhip64: hipMemAddressReserve,
 * hipMemCreate, hipMemMap, hipMemSetAccess, hipMemUnmap, hipMemRelease, hipMemAddressFree,
 * hipMemGetAllocationGranularity), for tests on machines without an AMD GPU. Built at test
 * time (tests/hip_standin.py) and loaded by the runtime's own hipMem* path.
 *
 * Host memory plays device memory: a reserved range is an anonymous mapping that reads
 * zeros, a physical allocation is a memfd, and hipMemMap maps that memfd over part of a
 * reservation (MAP_SHARED | MAP_FIXED), so one allocation mapped at many addresses aliases
 * as it does on the GPU, and every hipMemMap is one CPU mapping of the process, as ROCm 7.x
 * makes one per call. Mapped memory is inaccessible (PROT_NONE) until hipMemSetAccess.
 *
 * Every check is ROCm's own, as its source states it, in two versions:
 *   CLR_2024: ROCm/clr hipamd/src/hip_vm.cpp at f9f995c6d0aecec28debd3db0f41df0c15ec003d
 *     (amd-staging, 2024-10-22; ROCm 6.3). hipMemGetAllocationGranularity returns the
 *     pool's runtime allocation granule (4 KiB on MI300X/MI355X) for the minimum and the
 *     recommended option alike; hipMemAddressReserve refuses a size that is not a multiple
 *     of it or an alignment that is not a power of two with hipErrorMemoryAllocation (2);
 *     hipMemMap enqueues the mapping and returns hipSuccess whatever became of it.
 *   CLR_2026: ROCm/rocm-systems projects/clr/hipamd/src/hip_vm.cpp at
 *     048cb7b7ed02f36c9ce2be061dd11d3774bff9af. Minimum (4 KiB) and recommended (2 MiB)
 *     granularity apart; hipMemAddressReserve refuses the same with hipErrorInvalidValue
 *     (1); hipMemMap refuses a size that is not a multiple of the minimum granularity and
 *     returns the mapping's own failure; hipMemSetAccess and hipMemUnmap take only ranges
 *     that are whole mapped sub-ranges (ValidateSubBufferCoverage).
 * Both: flags must be 0; hipMemCreate takes pinned device memory only (location id below
 * the device count), a handle type of none or POSIX fd, and a size that is a multiple of
 * memBaseAddrAlign_ (2048: rocclr/device/rocm/rocdevice.cpp); hipMemMap takes offset 0.
 *
 * Not in clr's source, so chosen here and said: a reserved range that nothing is mapped
 * over reads zeros (a GPU may fault instead); stricter than clr, hipMemAddressFree refuses
 * a range that still has mappings, and hipMemMap refuses a range not inside one
 * reservation, past the allocation's size, or over a live mapping.
 *
 * Test controls (not HIP): hipStandinConfigure, hipStandinLiveMappings,
 * hipStandinPhysicalBytes, hipStandinReservations.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int hipError_t;
enum {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2, /* hipErrorMemoryAllocation is the same value */
  hipErrorInvalidDevice = 101,
  hipErrorNotSupported = 801,
};

typedef struct {
  int type; /* hipMemLocationTypeDevice = 1 */
  int id;
} hipMemLocation;

typedef struct {
  int type; /* hipMemAllocationTypePinned = 1 */
  int requestedHandleTypes; /* none = 0, POSIX file descriptor = 1 */
  hipMemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
  } allocFlags;
} hipMemAllocationProp;

typedef struct {
  hipMemLocation location;
  int flags; /* none 0, read 1, read-write 3 */
} hipMemAccessDesc;

enum { CLR_2024 = 2024, CLR_2026 = 2026 };

static struct {
  int clr;
  size_t min_granule, rec_granule;
  int silent_map; /* hipMemMap reports success and maps nothing */
  long max_mappings; /* past it a mapping fails as mmap does past vm.max_map_count */
  int devices;
  size_t device_memory;
} cfg = {CLR_2026, 4096, 2 << 20, 0, 65530, 1, (size_t)8 << 30};

#define MAX_RANGES 4096
#define MAX_MAPS 65536
#define MAX_ALLOCS 65536

typedef struct { uintptr_t base; size_t size; } range_t;
typedef struct { uintptr_t ptr; size_t size; int alloc; int access; } map_t;
typedef struct { int fd; size_t size; int refs; int released; } alloc_t;

static range_t ranges[MAX_RANGES];
static map_t *maps;
static alloc_t allocs[MAX_ALLOCS];
static long live_maps;
static long map_top; /* slots in use lie below it */
static size_t physical_bytes;

void hipStandinConfigure(int clr, size_t min_granule, size_t rec_granule, int silent_map,
                         long max_mappings, int devices, size_t device_memory) {
  cfg.clr = clr;
  cfg.min_granule = min_granule;
  cfg.rec_granule = rec_granule;
  cfg.silent_map = silent_map;
  cfg.max_mappings = max_mappings;
  cfg.devices = devices;
  cfg.device_memory = device_memory;
}

long hipStandinLiveMappings(void) { return live_maps; }
size_t hipStandinPhysicalBytes(void) { return physical_bytes; }
long hipStandinReservations(void) {
  long n = 0;
  for (int i = 0; i < MAX_RANGES; i++) n += ranges[i].size != 0;
  return n;
}

static int pow2_or_zero(size_t x) { return (x & (x - 1)) == 0; }

static range_t *range_holding(uintptr_t p, size_t size) {
  for (int i = 0; i < MAX_RANGES; i++) {
    range_t *r = &ranges[i];
    if (r->size && p >= r->base && p - r->base <= r->size && size <= r->size - (p - r->base))
      return r;
  }
  return NULL;
}

static map_t *map_at(uintptr_t p) {
  for (long i = 0; i < map_top; i++)
    if (maps[i].size && maps[i].ptr == p) return &maps[i];
  return NULL;
}

static int overlaps_map(uintptr_t p, size_t size) {
  for (long i = 0; i < map_top; i++)
    if (maps[i].size && p < maps[i].ptr + maps[i].size && maps[i].ptr < p + size) return 1;
  return 0;
}

/* Whole mapped sub-ranges, back to back from p, covering exactly size bytes. */
static int covered(uintptr_t p, size_t size) {
  size_t done = 0;
  while (done < size) {
    map_t *m = map_at(p + done);
    if (!m || m->size > size - done) return 0;
    done += m->size;
  }
  return 1;
}

static void drop_alloc_ref(int a) {
  if (--allocs[a].refs == 0) {
    close(allocs[a].fd);
    physical_bytes -= allocs[a].size;
    memset(&allocs[a], 0, sizeof(allocs[a]));
  }
}

static int granule_check_prop(const hipMemAllocationProp *prop) {
  return prop && prop->type == 1 && prop->location.type == 1 && prop->location.id >= 0 &&
         prop->location.id < cfg.devices;
}

hipError_t hipMemGetAllocationGranularity(size_t *granularity, const hipMemAllocationProp *prop,
                                          int option) {
  if (!granularity || !granule_check_prop(prop) || (option != 0 && option != 1))
    return hipErrorInvalidValue;
  *granularity = (cfg.clr == CLR_2024 || option == 0) ? cfg.min_granule : cfg.rec_granule;
  return hipSuccess;
}

hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
                                unsigned long long flags) {
  (void)addr;
  if (!ptr || flags != 0) return hipErrorInvalidValue;
  hipError_t refused = cfg.clr == CLR_2024 ? hipErrorOutOfMemory : hipErrorInvalidValue;
  if (size == 0 || size % cfg.min_granule != 0 || !pow2_or_zero(alignment)) return refused;
  size_t align = alignment ? alignment : cfg.min_granule;
  int slot = -1;
  for (int i = 0; i < MAX_RANGES && slot < 0; i++)
    if (!ranges[i].size) slot = i;
  if (slot < 0) return hipErrorOutOfMemory;
  uint8_t *raw = mmap(NULL, size + align, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return hipErrorOutOfMemory;
  uintptr_t base = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
  if (base > (uintptr_t)raw) munmap(raw, base - (uintptr_t)raw);
  size_t tail = (uintptr_t)raw + size + align - (base + size);
  if (tail) munmap((void *)(base + size), tail);
  ranges[slot].base = base;
  ranges[slot].size = size;
  *ptr = (void *)base;
  return hipSuccess;
}

hipError_t hipMemAddressFree(void *devPtr, size_t size) {
  if (!devPtr || size == 0) return hipErrorInvalidValue;
  for (int i = 0; i < MAX_RANGES; i++) {
    if (ranges[i].size && ranges[i].base == (uintptr_t)devPtr) {
      if (overlaps_map(ranges[i].base, ranges[i].size)) return hipErrorInvalidValue;
      munmap(devPtr, ranges[i].size);
      ranges[i].base = 0;
      ranges[i].size = 0;
      return hipSuccess;
    }
  }
  return hipErrorInvalidValue;
}

hipError_t hipMemCreate(unsigned long long *handle, size_t size, const hipMemAllocationProp *prop,
                        unsigned long long flags) {
  if (!handle || size == 0 || flags != 0 || !prop || prop->type != 1 || prop->location.type != 1)
    return hipErrorInvalidValue;
  if (prop->location.id < 0 || prop->location.id >= cfg.devices)
    return cfg.clr == CLR_2024 ? hipErrorInvalidValue : hipErrorInvalidDevice;
  if (prop->requestedHandleTypes != 0 && prop->requestedHandleTypes != 1)
    return hipErrorNotSupported;
  if (size > cfg.device_memory - physical_bytes) return hipErrorOutOfMemory;
  if (size % 2048 != 0) return hipErrorInvalidValue;
  int slot = -1;
  for (int i = 1; i < MAX_ALLOCS && slot < 0; i++)
    if (!allocs[i].refs) slot = i;
  if (slot < 0) return hipErrorOutOfMemory;
  int fd = memfd_create("hip-standin", 0);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return hipErrorOutOfMemory;
  allocs[slot] = (alloc_t){fd, size, 1, 0};
  physical_bytes += size;
  *handle = (unsigned long long)slot;
  return hipSuccess;
}

static int live_alloc(unsigned long long handle) {
  return handle > 0 && handle < MAX_ALLOCS && allocs[handle].refs > 0;
}

hipError_t hipMemMap(void *ptr, size_t size, size_t offset, unsigned long long handle,
                     unsigned long long flags) {
  if (!ptr || handle == 0 || size == 0 || offset != 0 || flags != 0) return hipErrorInvalidValue;
  if (!live_alloc(handle) || allocs[handle].released) return hipErrorInvalidValue;
  int old = cfg.clr == CLR_2024; /* the mapping's outcome is not returned */
  if (!old && size % cfg.min_granule != 0) return hipErrorInvalidValue;
  if (cfg.silent_map) return hipSuccess;
  uintptr_t p = (uintptr_t)ptr;
  if (!range_holding(p, size) || size > allocs[handle].size || overlaps_map(p, size))
    return old ? hipSuccess : hipErrorInvalidValue;
  if (live_maps >= cfg.max_mappings) return old ? hipSuccess : hipErrorOutOfMemory;
  if (!maps) maps = calloc(MAX_MAPS, sizeof(map_t));
  long slot = -1;
  for (long i = 0; i < MAX_MAPS && slot < 0; i++)
    if (!maps[i].size) slot = i;
  if (slot < 0) return old ? hipSuccess : hipErrorOutOfMemory;
  void *got = mmap(ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, allocs[handle].fd, 0);
  if (got == MAP_FAILED) return old ? hipSuccess : hipErrorOutOfMemory;
  maps[slot] = (map_t){p, size, (int)handle, 0};
  if (slot >= map_top) map_top = slot + 1;
  allocs[handle].refs++;
  live_maps++;
  return hipSuccess;
}

hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc, size_t count) {
  if (!ptr || size == 0 || !desc || count == 0) return hipErrorInvalidValue;
  uintptr_t p = (uintptr_t)ptr;
  /* clr 2026 takes whole mapped sub-ranges only; clr 2024 hands any reserved range on. */
  if (cfg.clr == CLR_2024 ? !range_holding(p, size) : !covered(p, size))
    return hipErrorInvalidValue;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != 1 || desc[i].location.id < 0 ||
        desc[i].location.id >= cfg.devices)
      return hipErrorInvalidValue;
    if (desc[i].flags != 0 && desc[i].flags != 1 && desc[i].flags != 3)
      return hipErrorInvalidValue;
  }
  int prot = desc[count - 1].flags == 3   ? PROT_READ | PROT_WRITE
             : desc[count - 1].flags == 1 ? PROT_READ
                                          : PROT_NONE;
  if (mprotect(ptr, size, prot) != 0) return hipErrorInvalidValue;
  for (long i = 0; i < map_top; i++)
    if (maps[i].size && maps[i].ptr >= p && maps[i].ptr < p + size)
      maps[i].access = desc[count - 1].flags;
  return hipSuccess;
}

hipError_t hipMemUnmap(void *ptr, size_t size) {
  if (!ptr || size == 0) return hipErrorInvalidValue;
  uintptr_t p = (uintptr_t)ptr;
  if (!covered(p, size)) return hipErrorInvalidValue;
  for (size_t done = 0; done < size;) {
    map_t *m = map_at(p + done);
    size_t piece = m->size;
    /* The range stays reserved: anonymous memory reading zeros again. */
    mmap((void *)m->ptr, piece, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    drop_alloc_ref(m->alloc);
    memset(m, 0, sizeof(*m));
    live_maps--;
    done += piece;
  }
  return hipSuccess;
}

hipError_t hipMemRelease(unsigned long long handle) {
  if (handle == 0) return hipErrorInvalidValue;
  if (!live_alloc(handle) || allocs[handle].released) return hipErrorInvalidValue;
  allocs[handle].released = 1;
  drop_alloc_ref((int)handle);
  return hipSuccess;
}

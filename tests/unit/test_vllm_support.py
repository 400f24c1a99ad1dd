"""The vLLM guard: the version series and the extension points, read from source."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import background
from vllm_rocm_asm_decode import vllm_support
from vllm_rocm_asm_decode.vllm_support import (
    EXTENSION_POINTS,
    ExtensionPoint,
    missing_extension_points,
    module_source,
    version_mismatch,
    vllm_mismatch,
)


@pytest.mark.parametrize(
    "version", ["0.33.0", "0.33.0+rocm722", "0.33.1.dev4+g1a2b3c", "0.33.2rc1", "0.33"]
)
def test_the_0_33_series_is_taken(version):
    assert version_mismatch(version) is None


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("0.34.0", "vLLM 0.34.0 is not 0.33.x"),
        ("0.34.0.dev12+rocm700", "vLLM 0.34.0.dev12+rocm700 is not 0.33.x"),
        ("0.32.9", "vLLM 0.32.9 is not 0.33.x"),
        ("0.11.1+rocm700", "vLLM 0.11.1+rocm700 is not 0.33.x"),
        ("1.33.0", "vLLM 1.33.0 is not 0.33.x"),
        ("dev", "vLLM reports version 'dev'"),
        (None, "vLLM is not installed"),
    ],
)
def test_other_versions_are_refused_in_one_line(version, says):
    why = version_mismatch(version)
    assert why is not None and why.startswith(says) and "\n" not in why


def test_the_installed_vllm_has_every_extension_point():
    assert missing_extension_points() == []
    assert vllm_mismatch() is None


def _live(point: ExtensionPoint):
    obj = importlib.import_module(point.module)
    for part in point.name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("point", EXTENSION_POINTS, ids=lambda p: f"{p.module}:{p.name}")
def test_what_the_source_reader_sees_is_what_the_live_objects_have(point):
    """Each point read from source agrees with the imported object: its parameters in
    the order the guard wants them (or by name), its fields."""
    live = _live(point)
    if dataclasses.is_dataclass(live):
        fields = {f.name for f in dataclasses.fields(live)}
        assert set(point.parameters) <= fields
        return
    if not point.parameters:
        return
    names = [n for n in inspect.signature(live).parameters if n not in ("self", "cls")]
    if point.positional:
        assert names[: len(point.parameters)] == list(point.parameters)
    else:
        assert set(point.parameters) <= set(names)


def _edited(module: str, old: str, new: str):
    def read(name: str) -> str | None:
        text = module_source(name)
        if name == module and text is not None:
            assert old in text, f"{old!r} not in {module}"
            text = text.replace(old, new)
        return text

    return read


ROCM_ATTN = "vllm.v1.attention.backends.rocm_attn"


@pytest.mark.parametrize(
    ("module", "old", "new", "says"),
    [
        (
            ROCM_ATTN,
            "class RocmAttentionImpl(",
            "class RocmAttnImpl(",
            f"{ROCM_ATTN} has no RocmAttentionImpl",
        ),
        (
            ROCM_ATTN,
            "    def get_builder_cls(",
            "    def builder_cls(",
            "RocmAttentionBackend.get_builder_cls is gone",
        ),
        (
            ROCM_ATTN,
            "    block_table: torch.Tensor\n",
            "    block_tables: torch.Tensor\n",
            "RocmAttentionMetadata has no field block_table",
        ),
        (
            ROCM_ATTN,
            "        output_block_scale",
            "        output_block_scales",
            "RocmAttentionImpl.forward takes (",
        ),
        (
            "vllm.v1.attention.ops.prefix_prefill",
            "    interleaved_v_pack_factor: int = 0,",
            "    v_pack: int = 0,",
            "context_attention_fwd takes no interleaved_v_pack_factor",
        ),
        (
            "vllm.v1.attention.backend",
            "    def _init_reorder_batch_threshold(",
            "    def _init_reorder_threshold(",
            "RocmAttentionMetadataBuilder._init_reorder_batch_threshold is gone",
        ),
        (
            "vllm._aiter_ops",
            "    def pa_fwd_asm(",
            "    def paged_attention_asm(",
            "rocm_aiter_ops.pa_fwd_asm is gone",
        ),
        (
            "vllm.v1.attention.backends.registry",
            "    ROCM_ATTN = ",
            "    ROCM_ATTENTION = ",
            "AttentionBackendEnum.ROCM_ATTN is gone",
        ),
        (
            ROCM_ATTN,
            "        common_prefix_len: int,\n"
            "        common_attn_metadata: CommonAttentionMetadata,",
            "        common_attn_metadata: CommonAttentionMetadata,\n"
            "        common_prefix_len: int,",
            "RocmAttentionMetadataBuilder.build takes (",
        ),
    ],
    ids=[
        "class",
        "method",
        "field",
        "parameter",
        "keyword",
        "inherited",
        "aiter-op",
        "enum",
        "parameters-reordered",
    ],
)
def test_a_moved_extension_point_is_named(module, old, new, says):
    why = vllm_mismatch("0.33.1.dev7", read=_edited(module, old, new))  # one, no "(and"
    assert why is not None and "(and " not in why, why
    assert why.startswith(f"vLLM 0.33.1.dev7 moved what the plugin extends: {says}"), why


def test_a_method_the_subclass_defines_is_read_from_the_subclass():
    """RocmAttentionMetadataBuilder defines build_for_cudagraph_capture itself: its own
    signature counts (the base's is right)."""
    read = _edited(
        ROCM_ATTN,
        "        self, common_attn_metadata: CommonAttentionMetadata\n"
        "    ) -> RocmAttentionMetadata:",
        "        self, metadata: CommonAttentionMetadata\n    ) -> RocmAttentionMetadata:",
    )
    (problem,) = missing_extension_points(read=read)
    assert problem == (
        "RocmAttentionMetadataBuilder.build_for_cudagraph_capture takes (metadata), "
        "not (common_attn_metadata, ...)"
    )


def test_a_missing_module_and_unparsable_source_are_named():
    def read(name: str) -> str | None:
        if name == ROCM_ATTN:
            return None
        if name == "vllm.v1.attention.backends.registry":
            return "def broken(:\n"
        return module_source(name)

    missing = missing_extension_points(read=read)
    assert f"no module {ROCM_ATTN}" in missing
    assert "no module vllm.v1.attention.backends.registry" in missing
    every = missing_extension_points((*EXTENSION_POINTS, *vllm_support.runtime_imports()), read)
    assert vllm_mismatch("0.33.0", read=read).endswith(f"(and {len(every) - 1} more)")


def test_keywords_pass_through_kwargs_and_static_methods_keep_their_first_parameter():
    source = (
        "class Ops:\n"
        "    @staticmethod\n"
        "    def run(Q, K, out_=None):\n        pass\n"
        "    def call(self, **kwargs):\n        pass\n"
    )
    points = [
        ExtensionPoint("m", "Ops.run", ("Q", "K"), positional=True),
        ExtensionPoint("m", "Ops.call", ("anything",)),
        ExtensionPoint("m", "Ops.run", ("V",)),
    ]
    assert missing_extension_points(points, read=lambda _: source) == ["Ops.run takes no V"]


_IMPORTS_PROBE = (
    "import sys, vllm\n"
    "before = set(sys.modules)\n"
    "from vllm_rocm_asm_decode.vllm_support import vllm_mismatch\n"
    "assert vllm_mismatch() is None\n"
    "print(sorted(m for m in set(sys.modules) - before if m.startswith('vllm.')))\n"
)
background.declare(
    "vllm-guard-imports",
    __file__,
    ["test_the_guard_imports_nothing_of_vllm_beyond_its_root"],
    lambda env: background.run(
        [sys.executable, "-c", _IMPORTS_PROBE], env, timeout=300, preloaded=True
    ),
    seconds=5,
)


def test_the_guard_imports_nothing_of_vllm_beyond_its_root():
    """register() runs in every process vLLM starts (the API server included): reading
    the extension points imports no vLLM module past ``vllm`` itself."""
    out = background.result("vllm-guard-imports")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_plugins_metadata_never_makes_pip_replace_an_images_vllm():
    """A ROCm image's vLLM (``0.33.0+rocm722``, a nightly ``0.34.0.dev``) stays: the
    package requires no vLLM nor torch; :func:`vllm_mismatch` judges vLLM at start-up."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in project["dependencies"]]
    assert names == ["packaging"]
    assert vllm_support.SUPPORTED_SERIES == (0, 33)


def _fake_distribution(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """This checkout built as a wheel (no build isolation: offline)."""
    out = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [*PIP, "wheel", "-q", "--no-deps", "--no-build-isolation", str(root), "-w", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("vllm_rocm_asm_decode-*.whl")
    return built


PIP = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check"]


@pytest.mark.slow
@pytest.mark.parametrize("image_vllm", ["0.34.0.dev3+rocm700", "0.33.0+rocm722", "0.11.1+rocm700"])
def test_pip_install_into_a_rocm_image_installs_the_plugin_alone(tmp_path, wheel, image_vllm):
    """``pip install --dry-run`` of the built wheel into an environment that holds a
    ROCm-style vLLM (of any version, in the 0.33 range or not): pip would install the
    plugin and nothing else, offline."""
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image)], check=True)
    site = subprocess.run(
        [image / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    _fake_distribution(Path(site), "vllm", image_vllm)
    _fake_distribution(Path(site), "packaging", "24.1")
    install = ["install", "--dry-run", "--no-index", "-q", "--report", "-", str(wheel)]
    out = subprocess.run(
        [*PIP, "--python", str(image / "bin/python"), *install],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [i["metadata"]["name"] for i in report["install"]] == ["vllm-rocm-asm-decode"]


def test_every_name_the_runtime_imports_from_vllm_is_guarded():
    """The guard covers what the runtime modules import from vLLM, found in their
    source (function-level imports included), so a moved one keeps stock ROCM_ATTN
    instead of an ImportError when vLLM resolves the backend."""
    names = {(p.module, p.name) for p in vllm_support.runtime_imports()}
    assert {
        ("vllm.v1.attention.ops.chunked_prefill_paged_decode", "has_native_kv_cache_layout"),
        ("vllm.v1.attention.ops.paged_attn", "PagedAttention"),
        ("vllm.utils.platform_utils", "num_compute_units"),
        ("vllm.platforms.rocm", "on_mi3xx"),
        ("vllm.model_executor.layers.quantization.kv_cache", "BaseKVCacheMethod"),
    } <= names
    for module, name in names:  # each resolves in the installed vLLM
        assert hasattr(importlib.import_module(module), name) or importlib.util.find_spec(
            f"{module}.{name}"
        ), (module, name)


def test_a_runtime_import_vllm_moved_is_named():
    read = _edited(
        "vllm.v1.attention.ops.chunked_prefill_paged_decode",
        "def has_native_kv_cache_layout(",
        "def native_layout(",
    )
    why = vllm_mismatch("0.33.0", read=read)
    assert why == (
        "vLLM 0.33.0 moved what the plugin extends: vllm.v1.attention.ops."
        "chunked_prefill_paged_decode has no has_native_kv_cache_layout"
    )


def test_an_answer_is_kept_until_a_module_it_read_changes(monkeypatch):
    """doctor and the heavy commands ask twice: the second answer parses nothing, unless
    a module the first read reads otherwise now (an edit of any size, at any mtime)."""
    moved = _edited(ROCM_ATTN, "    def get_builder_cls(", "    def builder_cls(")
    edits: list[str] = []
    monkeypatch.setattr(
        vllm_support, "module_source", lambda m: (moved if edits else module_source)(m)
    )
    parses: list[str | None] = []
    parse = vllm_support._parsed
    monkeypatch.setattr(vllm_support, "_parsed", lambda text: parses.append(text) or parse(text))
    assert vllm_mismatch() is None and parses
    first = len(parses)
    assert vllm_mismatch() is None and len(parses) == first  # kept
    edits.append(ROCM_ATTN)
    why = vllm_mismatch()  # judged again, on the module as it reads now
    assert why is not None and "RocmAttentionBackend.get_builder_cls is gone" in why, why
    assert len(parses) > first

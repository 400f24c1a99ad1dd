"""``upstream DIR [--stage N]``: the in-tree form as a stack of pull requests written from
the runtime's core into a vLLM 0.33 tree (here: the installed vLLM's edited files and its
version file), anchored on names, all or nothing, idempotent, refused for other vLLMs."""

from __future__ import annotations

import ast
import fcntl
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_rocm_asm_decode.tools import upstream
from vllm_rocm_asm_decode.tools.cli import main

RUNTIME = Path(upstream.__file__).resolve().parents[2]
EDITED = (
    upstream.ROCM_ATTN,
    upstream.AITER_OPS,
    upstream.ATTENTION_CONFIG,
    upstream.PAGED_DECODE,
    upstream.ROCM_AITER_FA,
)


def installed_vllm() -> Path:
    spec = find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


@pytest.fixture
def tree(tmp_path) -> Path:
    """The files ``upstream`` reads, copied from the installed vLLM 0.33."""
    return stock_tree(tmp_path / "vllm-src")


def stock_tree(root: Path) -> Path:
    for rel in (*EDITED, Path("vllm/envs.py"), Path("vllm/_version.py")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_vllm().parent / rel, root / rel)
    return root


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["stage-1", "stage-2", "stage-3"])
def applied(request, tmp_path_factory) -> tuple[Path, int]:
    """A tree with stages 1..N applied (read only), and N."""
    root = stock_tree(tmp_path_factory.mktemp(f"applied-{request.param}") / "vllm-src")
    upstream.apply(root, request.param)
    return root, request.param


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["upstream", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_writes_nothing_apply_writes_the_same_and_a_second_apply_nothing(tree, capsys):
    before = snapshot(tree)
    code, checked, err = run(capsys, str(tree), "--check")
    assert code == 1 and err == "" and "would change (nothing written)" in checked
    assert snapshot(tree) == before
    code, applied, _ = run(capsys, str(tree))
    assert code == 0
    stat, _, text = applied.partition("\n--- pull-request text, stage 1 ---\n")
    assert checked.splitlines()[1:] == stat.splitlines()[1:]  # the same diff stat
    assert text == upstream.pr_text(1) and "pull-request text" not in checked
    assert "4 files changed" in applied and "(new)" in applied
    after = snapshot(tree)
    for argv in ((str(tree),), (str(tree), "--check"), (str(tree), "--stage", "1")):
        code, again, _ = run(capsys, *argv)
        assert code == 0 and again.endswith(
            "already carries stage 1 of this change; nothing to do\n"
        )
        assert snapshot(tree) == after


def test_stage_2_applies_on_stage_1_as_at_once_and_stage_1_then_has_nothing_to_do(
    tree, tmp_path, capsys
):
    at_once = stock_tree(tmp_path / "at-once")
    upstream.apply(at_once, 2)
    upstream.apply(tree, 1)
    code, out, _ = run(capsys, str(tree), "--stage", "2")
    assert code == 0 and "rocm_attn.py" in out and "chunked_prefill_paged_decode.py" in out
    assert snapshot(tree) == snapshot(at_once)
    for stage, which in (("1", "stage 1"), ("2", "stages 1-2")):
        code, out, _ = run(capsys, str(tree), "--stage", stage)
        assert code == 0 and out.endswith(
            f"already carries {which} of this change; nothing to do\n"
        )
    assert snapshot(tree) == snapshot(at_once)


def test_stage_3_stacked_on_stage_1_writes_what_it_writes_at_once(tree, tmp_path):
    """The kernel test file moves up the stack with the stages (stage 3 lifts the cap of
    four tables that stage 1's file tests, and changes that test alone); stage 1 run
    again on stage 3 changes nothing."""
    at_once = stock_tree(tmp_path / "at-once")
    upstream.apply(at_once, 3)
    upstream.apply(tree, 1)
    written = (tree / upstream.KERNEL_TEST).read_text()
    upstream.apply(tree, 3)
    assert snapshot(tree) == snapshot(at_once)
    lifted = (tree / upstream.KERNEL_TEST).read_text()
    removed = set(written.splitlines()) - set(lifted.splitlines())
    assert removed == {
        "    for layers in (3, 4):  # 3 K tables and a V, each layer's own; 4 and a V: none",
        "        scales = [(2.0**i, 3.0) for i in range(layers)]  # rising: a misfiled one shows",
        "        many = Model(tmp_path, 16, 8, 3, torch.bfloat16, scales)",
        "        bound = many.builder.build(0, step).asm_scales.items()  # the budget: 4 tables",
        "        held = {x: (k.unique().item(), v.unique().item()) for x, (k, v) in bound}",
        "        own = {x: (x._k_scale_float, x._v_scale_float) for x in many.layers}",
        "        assert held == (own if layers == 3 else {})",
        "    builder, more than 4 tables. An output quant fused in: HIP; else asm, the",
    }, removed
    upstream.apply(tree, 1)
    assert snapshot(tree) == snapshot(at_once)
    upstream.apply(tree, 2)
    assert snapshot(tree) == snapshot(at_once)


@pytest.mark.parametrize("given", ["+1", " 1 ", "01"], ids=["sign", "spaces", "zero"])
def test_a_stage_is_a_number_as_every_number_here(given):
    """(trial 24) A sign and spaces around the digits, as usage.md says of numbers."""
    from vllm_rocm_asm_decode.tools import cli

    assert cli.build_parser().parse_args(["upstream", ".", "--stage", given]).stage == 1


@pytest.mark.parametrize("stage", ["0", "-1", "+4", "4", "two", "", "\u0662", "1.0"])
def test_a_stage_that_is_not_there_is_one_line(tree, capsys, stage):
    with pytest.raises(SystemExit) as exit_:
        main(["upstream", str(tree), "--stage", stage])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.endswith(f"argument --stage: {stage!r}: choose 1 to 3\n"), err


def test_stage_1_is_about_a_hundred_lines_inside_rocm_attn_py(tree):
    """The first pull request: at most 150 lines added to vLLM's own files outside
    tests/ (the review's aim: about 100), no new file under vllm/, no new environment
    variable (its switch is a field of AttentionConfig)."""
    import difflib

    envs = (tree / "vllm/envs.py").read_text()
    files = upstream.changed_files(tree, 1)
    new_files = [rel for rel in files if not (tree / rel).exists()]
    assert [rel for rel in new_files if rel.parts[0] == "vllm"] == []
    assert new_files == [upstream.KERNEL_TEST]
    added = 0
    for rel, text in files.items():
        if rel.parts[0] != "vllm":
            continue
        old = (tree / rel).read_text().splitlines()
        diff = difflib.unified_diff(old, text.splitlines(), lineterm="", n=0)
        added += sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
    edited = {upstream.ROCM_ATTN, upstream.AITER_OPS, upstream.ATTENTION_CONFIG}
    assert set(files) == edited | {upstream.KERNEL_TEST}
    assert added <= 150, added
    # Its switch is a field of AttentionConfig (no environment variable), off by default.
    old = (tree / upstream.ATTENTION_CONFIG).read_text().splitlines()
    new = files[upstream.ATTENTION_CONFIG].splitlines()
    added_lines = list(difflib.unified_diff(old, new, lineterm="", n=0))[3:]  # one hunk
    assert [d[:1] for d in added_lines] == ["+"] * 3
    assert added_lines[1] == "+    use_aiter_asm_decode: bool = False"
    assert Path("vllm/envs.py") not in files and (tree / "vllm/envs.py").read_text() == envs
    text = files[upstream.ROCM_ATTN]
    assert "class AsmDecode" not in text.split("class RocmAttentionMetadata:")[0]  # no mixin
    assert "Mixin" not in text and "VLLM_ROCM_ASM" not in text
    # One line, once: how many layers decode on asm, or as a warning why none does (no
    # layer qualifies, AITER's switch or version, max_num_seqs, the table cap), and the
    # last layer the rule keeps on HIP with its reasons.
    assert text.count("logger.info") == 1 and text.count("logger.debug") == 0
    assert "log = logger.warning_once if why else logger.info_once" in text
    # Its test file: ~200 lines, at least 12 tests (docs/upstream.md says what is in it).
    test_file = files[upstream.KERNEL_TEST]
    assert len(test_file.splitlines()) <= 306 and test_file.count("\ndef test_") >= 4


def test_a_file_where_a_directory_goes_stops_check_and_apply_alike(tree, capsys):
    (tree / "tests/kernels").mkdir(parents=True)
    (tree / "tests/kernels/attention").write_text("a file where a directory goes\n")
    before = snapshot(tree)
    for argv in ((str(tree), "--check"), (str(tree),)):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert "tests/kernels/attention is in the way (it should be a directory)" in err
    assert snapshot(tree) == before


def test_a_failure_while_replacing_puts_every_file_back(tree, capsys, monkeypatch):
    """All or nothing: the last file cannot be replaced; the ones replaced before it are
    restored, the staged copies and the directories the run made are gone."""
    import os

    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # after rocm_attn.py and _aiter_ops.py went in
            raise PermissionError(1, "Operation not permitted")
        real(src, dst)

    monkeypatch.setattr(upstream.os, "replace", replace)
    before = snapshot(tree)
    dirs_before = sorted(p for p in tree.rglob("*") if p.is_dir())
    code, _, err = run(capsys, str(tree))
    assert code == 2 and "Operation not permitted; no file was changed" in err, err
    assert snapshot(tree) == before
    assert sorted(p for p in tree.rglob("*") if p.is_dir()) == dirs_before


def test_file_modes_are_kept_and_new_files_get_the_umasks(tree):
    (tree / upstream.AITER_OPS).chmod(0o755)
    plain = tree / "plain"
    plain.write_text("")  # what any new file gets here
    upstream.apply(tree, 3)
    assert (tree / upstream.AITER_OPS).stat().st_mode & 0o777 == 0o755
    for new in (upstream.KERNEL_TEST, upstream.SCALE_TABLES):
        assert (tree / new).stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


@pytest.mark.parametrize(
    "link", ["vllm", "vllm/v1/attention", "vllm/v1/attention/backends"], ids=str
)
def test_a_symlink_into_an_installed_vllm_is_refused(tree, tmp_path, capsys, link):
    """A symlink at ``vllm/`` or at any directory further down into a site-packages."""
    site = tmp_path / "site-packages"
    (site / link).parent.mkdir(parents=True)
    (tree / link).rename(site / link)
    (site / "vllm-0.33.0.dist-info").mkdir()
    (tree / link).symlink_to(site / link)
    before = snapshot(site)
    for argv in ((str(tree),), (str(tree), "--check")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "reaches an installed vLLM" in err and "dist-info" in err, err
    assert snapshot(site) == before


@pytest.mark.parametrize("kind", ["fifo", "dangling-symlink"])
@pytest.mark.parametrize(
    "rel",
    [upstream.ROCM_ATTN, Path("vllm/_aiter_ops.py"), upstream.KERNEL_TEST],
    # (trial 26) _aiter_ops.py, read after the tree's check, was to be moved aside, and
    # the next run said the tree was not vLLM's.
    ids=["edited", "edited-later", "new"],
)
def test_a_path_that_is_not_a_regular_file_is_refused(tree, capsys, kind, rel):
    (tree / rel).parent.mkdir(parents=True, exist_ok=True)
    (tree / rel).unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(tree / rel)
        why = "is not a regular file (a FIFO"
    else:
        (tree / rel).symlink_to(tree / "nowhere.py")
        why = f"is a dangling symlink (to {tree / 'nowhere.py'})"
    for argv in ((str(tree),), (str(tree), "--check")):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"{tree / rel} {why}" in err, err
        # A file the change edits goes back; one it writes goes aside (moved aside, an
        # edited file would be missing).
        fix = "move it aside" if rel == upstream.KERNEL_TEST else "put vLLM 0.33's own file back"
        assert fix in err and err.endswith("; nothing written\n"), err
        assert ("aside" in err) is (rel == upstream.KERNEL_TEST), err
    assert (tree / rel).is_symlink() or stat.S_ISFIFO((tree / rel).lstat().st_mode)


def test_a_byte_order_mark_is_named_with_its_path(tree, capsys):
    path = tree / upstream.ROCM_ATTN
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    for argv in ((str(tree),), (str(tree), "--check")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and f"{path} starts with a byte-order mark" in err, err
        assert "(git checkout -- the file, in a git tree)" in err  # (trial 25) not git


def test_a_byte_order_mark_in_the_version_file_gets_the_same_line(tree, capsys):
    path = tree / "vllm/_version.py"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 2 and f"{path} starts with a byte-order mark (U+FEFF)" in err, err
    assert "remove it (delete the first character)" in err  # git does not track it


def test_a_run_waits_for_another_on_the_same_tree_then_is_refused(tree, capsys, monkeypatch):
    """Another run's lock held on DIR (flock, as that run holds it): the run waits
    ``LOCK_WAIT_S``, then stops in one line, writing nothing."""
    monkeypatch.setattr(upstream, "LOCK_WAIT_S", 0.3)
    before = snapshot(tree)
    fd = os.open(tree, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.monotonic()
        code, out, err = run(capsys, str(tree))
        waited = time.monotonic() - started
    finally:
        os.close(fd)
    assert code == 2 and out == "" and "another upstream run has been writing" in err, err
    assert waited >= 0.3 and snapshot(tree) == before
    assert run(capsys, str(tree))[0] == 0  # the lock gone, the run goes


def test_a_symlinked_file_is_replaced_not_written_through(tree, tmp_path):
    outside = tmp_path / "installed_rocm_attn.py"
    (tree / upstream.ROCM_ATTN).rename(outside)
    (tree / upstream.ROCM_ATTN).symlink_to(outside)
    original = outside.read_bytes()
    upstream.apply(tree)
    assert outside.read_bytes() == original
    assert not (tree / upstream.ROCM_ATTN).is_symlink()
    assert "def _asm_decode_rejections(" in (tree / upstream.ROCM_ATTN).read_text()


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        (
            "self._asm_cut = 0  # set when the layers are bound (build())",
            "self._asm_cut = 0  # set at the first build()",
            "RocmAttentionMetadataBuilder.__init__",
        ),
        (
            '(impl.alibi_slopes is None, "ALiBi"),',
            '(impl.alibi_slopes is None, "alibi"),',
            "the module",
        ),
    ],
    ids=["wiring", "rule"],
)
def test_another_version_of_the_change_is_refused_not_stacked(tree, capsys, old, new, where):
    upstream.apply(tree)
    path = tree / upstream.ROCM_ATTN
    assert path.read_text().count(old) == 1
    path.write_text(path.read_text().replace(old, new))
    before = snapshot(tree)
    code, _, err = run(capsys, str(tree))
    line = next(i for i, x in enumerate(path.read_text().splitlines(), 1) if new in x)
    assert code == 2 and f"another version of this change is in {where} (line {line} " in err
    assert f"reads {new.strip()!r} where it writes {old.strip()!r})" in err, err
    hint = f"copy {upstream.ROCM_ATTN} from an unmodified vLLM 0.33.x"  # not a git tree
    assert hint in err and snapshot(tree) == before


@pytest.mark.parametrize(
    ("damage", "message"),
    [(b"# caf\xe9\n", "is not UTF-8 text"), (None, "is not a vLLM source tree")],
    ids=["latin-1-byte", "aiter-ops-missing"],
)
def test_unreadable_files_are_one_line(tree, capsys, damage, message):
    if damage is None:
        (tree / upstream.AITER_OPS).unlink()
    else:
        with open(tree / upstream.ROCM_ATTN, "ab") as f:
            f.write(damage)
    for argv in ((str(tree),), (str(tree), "--check")):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
        assert str(tree) in err and "upstream-check" not in err  # names DIR, not the copy
        assert err.endswith("; nothing written\n") or damage is None, err  # (trial 26)


def test_vllms_files_only_gain_lines_except_where_an_import_grows(tree):
    import difflib

    before = {rel: (tree / rel).read_text().splitlines() for rel in EDITED}
    upstream.apply(tree, 2)
    removed = {
        rel: [
            line[1:]
            for line in difflib.unified_diff(old, (tree / rel).read_text().splitlines(), n=0)
            if line.startswith("-") and not line.startswith("---") and line[1:].strip(" )")
        ]
        for rel, old in before.items()
    }
    assert removed[upstream.AITER_OPS] == [] and removed[upstream.PAGED_DECODE] == []
    # rocm_attn.py: one import gains a name (stage 2); nothing of vLLM's code changes.
    assert [line.strip() for line in removed[upstream.ROCM_ATTN]] == [
        "from vllm.config import VllmConfig",
    ]


def _statements(source: str) -> list[str]:
    return [ast.dump(node) for node in ast.parse(source).body]


@pytest.mark.parametrize("module", ["core", "mixed"])
def test_the_written_rule_is_the_runtime_modules_code(applied, module):
    """Everything below the imports of core.py (stage 1) and mixed.py (stage 2) is in
    rocm_attn.py, statement for statement and byte for byte, its names private there
    and the plugin's own call (``asm_decode``) left out."""
    root, stage = applied
    if module == "mixed" and stage < 2:
        pytest.skip("stage 2 writes mixed.py")
    from vllm_rocm_asm_decode.tools.upstream.stages import (
        PLUGIN_ONLY,
        as_written,
        runtime_block,
    )

    raw, _ = runtime_block(module)
    block = as_written(raw)
    if module == "core":
        assert all(f"def {name}(" in raw and f"def {name}(" not in block for name in PLUGIN_ONLY)
        assert "_ASM_BLOCK_SIZE = 16" in block and "\nASM_" not in block
    written = (root / upstream.ROCM_ATTN).read_text()
    assert block in written
    expected = _statements(block)
    found = _statements(written)
    start = found.index(expected[0])
    assert found[start : start + len(expected)] == expected
    runtime = as_written((RUNTIME / f"{module}.py").read_text())
    assert (
        _statements(block)
        == [
            s
            for s in _statements(runtime)
            if "Import" not in s.split("(")[0] and "If(" not in s[:3]
        ][1:]
    )  # the module docstring is not written


def _node(tree: ast.AST, *names: str) -> ast.AST:
    """The class or def at ``names`` in ``tree``."""
    for name in names:
        tree = next(n for n in ast.iter_child_nodes(tree) if getattr(n, "name", "") == name)
    return tree


def _call(scope: ast.AST, text: str) -> ast.Call:
    (call,) = [
        n for n in ast.walk(scope) if isinstance(n, ast.Call) and ast.unparse(n).startswith(text)
    ]
    return call


def _keywords(call: ast.Call) -> dict[str | None, str]:
    return {k.arg: ast.unparse(k.value) for k in call.keywords}


def test_stage_1s_inline_decision_and_call_are_the_cores(applied):
    """Stage 1 decides the step in build() and calls pa_fwd_asm in forward() in lines of
    its own (core.py's use_asm_decode and asm_decode are the plugin's): the same clauses
    and the same arguments, over build()'s and forward()'s names."""
    from vllm_rocm_asm_decode import core

    root, _ = applied
    written = ast.parse((root / upstream.ROCM_ATTN).read_text())
    runtime = ast.parse(Path(core.__file__).read_text())
    build = _node(written, "RocmAttentionMetadataBuilder", "build")
    decide = [  # use_asm = a and b, then use_asm &= c, ...: the clauses a, b, c, ...
        n
        for n in build.body
        if isinstance(n, ast.Assign | ast.AugAssign)
        and ast.unparse(n.targets if isinstance(n, ast.Assign) else n.target) == "use_asm"
    ]
    assert all(isinstance(n.op, ast.BitAnd) for n in decide[1:] if isinstance(n, ast.AugAssign))
    written_clauses = [
        ast.unparse(v)
        for n in decide
        for v in (n.value.values if isinstance(n.value, ast.BoolOp) else [n.value])
    ]
    ret = _node(runtime, "use_asm_decode").body[-1]  # type: ignore[attr-defined]
    clauses = ast.unparse(ret.value)
    for name, local in (
        (r"common\.max_query_len", "max_query_len"),
        (r"common\.num_actual_tokens", "num_actual_tokens"),
        (r"common\.num_reqs", "common_attn_metadata.num_reqs"),
        (r"\bnum_heads\b", "self.num_heads_q"),
        (r"\bcut\b", "self._asm_cut"),
    ):
        clauses = re.sub(name, local, clauses)
    assert "common" not in clauses.replace("common_attn_metadata", "")
    expected = ast.parse(f"bool(self._asm_scales) and {clauses}", mode="eval").body
    assert isinstance(expected, ast.BoolOp)
    assert written_clauses == [ast.unparse(v) for v in expected.values]

    plugin = _keywords(_call(runtime, "rocm_aiter_ops.pa_fwd_asm("))
    forward = _node(written, "RocmAttentionImpl", "forward")
    in_tree = _keywords(_call(forward, "rocm_aiter_ops.pa_fwd_asm(Q=query[:num_actual"))
    renamed = {
        "query": "query[:num_actual_tokens]",
        "seq_lens": "seqused_k",
        "output": "output[:num_actual_tokens]",
        "ASM_PRECISION": "_ASM_PRECISION",
    }
    assert in_tree == {arg: renamed.get(value, value) for arg, value in plugin.items()}
    assert len(set(plugin.values()) & renamed.keys()) == len(renamed)


def added_text(root: Path, rel: Path) -> str:
    """What the change adds to a file (the whole file where it is new)."""
    import difflib

    stock = installed_vllm().parent / rel
    new = (root / rel).read_text().splitlines()
    if not stock.is_file():
        return "\n".join(new)
    diff = difflib.unified_diff(stock.read_text().splitlines(), new, lineterm="", n=0)
    return "\n".join(d[1:] for d in diff if d.startswith("+") and not d.startswith("+++"))


def test_nothing_only_the_plugin_needs_goes_in(applied):
    root, stage = applied
    for rel in upstream.written(stage):
        path = root / rel
        text = added_text(root, rel)
        for plugin_only in ("vllm_rocm_asm_decode", "vllm-rocm-asm-decode", "TRUST_AITER"):
            assert plugin_only not in text, (path.name, plugin_only)
        assert "plugin" not in text.lower(), path.name
        # vLLM's pre-commit refuses these torch.cuda calls (torch.accelerator instead).
        forbidden = re.search(
            r"torch\.cuda\.(empty_cache|synchronize|device_count|current_device|memory_"
            r"|max_memory|reset_peak|mem_get_info|set_device|device\(|manual_seed)",
            text,
        )
        assert forbidden is None, (path.name, forbidden)
        # Words of the plugin's own tools and settings.
        for word in ("plan", "doctor", "--num-gpu-blocks", "contract model", "TRUST"):
            assert word not in text or path.name.startswith("test_"), (path.name, word)


def test_what_it_writes_is_ruff_clean_at_vllms_settings(applied, tmp_path):
    """vLLM's line length (88) and lint families, vLLM as first party."""
    root, stage = applied
    config = tmp_path / "ruff.toml"
    config.write_text(
        "line-length = 88\ntarget-version = 'py310'\n[lint]\n"
        "select = ['E', 'F', 'UP', 'B', 'SIM', 'I', 'G']\n"
        "ignore = ['F405', 'F403', 'E731', 'B007']\n"  # as vLLM's own configuration
        "[lint.isort]\nknown-first-party = ['vllm']\n"
    )
    written = [root / rel for rel in upstream.written(stage)]
    ruff = Path(sys.executable).with_name("ruff")
    files = [str(p) for p in written]
    lint = subprocess.run(
        [str(ruff), "check", "--config", str(config), *files], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout
    # The edited vLLM files as well as the new ones are as ruff format writes them.
    fmt = subprocess.run(
        [str(ruff), "format", "--check", "--config", str(config), *files],
        capture_output=True,
        text=True,
    )
    assert fmt.returncode == 0, fmt.stdout


MOVED = {
    "impl-class": (
        upstream.ROCM_ATTN,
        "class RocmAttentionImpl(AttentionImpl):",
        "class RocmImpl(AttentionImpl):",
        "class RocmAttentionImpl not found in module",
        "1",
    ),
    "metadata-call": (
        upstream.ROCM_ATTN,
        "        attn_metadata = RocmAttentionMetadata(\n",
        "        attn_metadata = RocmMetadata(\n",
        "RocmAttentionMetadataBuilder.build: no `attn_metadata = RocmAttentionMetadata(...)`",
        "1",
    ),
    "forward-call": (
        upstream.ROCM_ATTN,
        "        chunked_prefill_paged_decode(\n            query=query[:num_actual_tokens],",
        "        unified_paged_decode(\n            query=query[:num_actual_tokens],",
        "RocmAttentionImpl.forward: no call of chunked_prefill_paged_decode",
        "1",
    ),
    "build-locals": (
        upstream.ROCM_ATTN,
        "        max_query_len = common_attn_metadata.max_query_len\n\n        max_seq_len",
        "        query_len = common_attn_metadata.max_query_len\n\n        max_seq_len",
        "RocmAttentionMetadataBuilder.build sets no num_actual_tokens or max_query_len",
        "1",
    ),
    "logger": (
        upstream.ROCM_ATTN,
        "logger = init_logger(__name__)\n",
        "LOG = init_logger(__name__)\n",
        "no module-level `logger = init_logger(__name__)`",
        "1",
    ),
    "pa-out": (
        upstream.AITER_OPS,
        '        out_: torch.Tensor,\n    ):\n        """Paged attention forward pass using '
        "assembly kernel.",
        '        out: torch.Tensor,\n    ):\n        """Paged attention forward pass using '
        "assembly kernel.",
        "rocm_aiter_ops.pa_fwd_asm: out_ is not its last argument",
        "1",
    ),
    "capture-build": (
        upstream.ROCM_ATTN,
        "        attn_metadata = self.build(0, common_attn_metadata)\n",
        "        attn_metadata = self.build(\n            0, common_attn_metadata\n        )\n",
        "RocmAttentionMetadataBuilder.build_for_cudagraph_capture: no `attn_metadata = "
        "self.build(0, common_attn_metadata)`",
        "2",  # stage 2's anchor (stage 1 leaves the capture as vLLM has it)
    ),
    "prefill-block": (
        upstream.PAGED_DECODE,
        "    if max_query_len > 1:\n        context_attention_fwd(",
        "    if max_query_len >= 2:\n        context_attention_fwd(",
        "chunked_prefill_paged_decode: no `if max_query_len > 1:` prefill block",
        "2",
    ),
}


@pytest.mark.parametrize("case", list(MOVED), ids=list(MOVED))
def test_a_moved_anchor_stops_with_one_line_and_writes_nothing(tree, capsys, case):
    rel, old, new, anchor, stage = MOVED[case]
    path = tree / rel
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    before = snapshot(tree)
    code, out, err = run(capsys, str(tree), "--stage", stage)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("vllm-rocm-asm-decode upstream: error: ")
    assert f"{rel}: anchor moved: {anchor}" in err, err
    assert err.rstrip().endswith(f"own: copy {rel} from an unmodified vLLM 0.33.x)"), err
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.33.0", True),
        ("0.33.2rc1.dev5+gabc", True),
        ("0.34.0", False),
        ("0.3.3", False),
        ("\uff10.33.0", False),  # a fullwidth 0, which int() would read
    ],
    ids=["0.33.0", "0.33-dev", "0.34.0", "0.3.3", "fullwidth-digit"],
)
def test_only_vllm_0_33_trees_are_taken(tree, capsys, version, ok):
    (tree / "vllm/_version.py").write_text(f"__version__ = version = '{version}'\n")
    code, _, err = run(capsys, str(tree), "--check")
    if ok:
        assert code == 1, err  # changes to make
    else:
        assert code == 2, err
        assert f"is vLLM {version} (from vllm/_version.py); this change is written" in err


def test_a_checkout_without_a_version_file_is_read_from_its_git_tag(tree, capsys):
    (tree / "vllm/_version.py").unlink()
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 2 and "cannot tell which vLLM" in err
    git = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    subprocess.run([*git, "tag", "v0.33.1"], check=True)
    assert upstream.tree_version(tree) == ("0.33.1", "its git tag")
    code, out, err = run(capsys, str(tree), "--check")
    assert code == 1 and "would change" in out, err
    # A _version.py left from an older build does not outrank the checkout's tag.
    (tree / "vllm/_version.py").write_text("__version__ = '0.34.1.dev5'\n")
    assert upstream.tree_version(tree) == ("0.33.1", "its git tag")
    subprocess.run([*git, "tag", "-d", "v0.33.1"], check=True, capture_output=True)
    subprocess.run([*git, "tag", "v0.32.0"], check=True)
    code, _, err = run(capsys, str(tree))
    assert code == 2 and "vLLM 0.32.0 (from its git tag)" in err
    # A tree inside another checkout does not take that checkout's tag.
    inner = tree / "inner"
    shutil.copytree(tree / "vllm", inner / "vllm", ignore=shutil.ignore_patterns("_version.py"))
    code, _, err = run(capsys, str(inner), "--check")
    assert code == 2 and "cannot tell which vLLM" in err


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "is not a vLLM source tree (no vllm/v1/attention/backends/rocm_attn.py)"),
        (lambda p: (p / "f", (p / "f").write_text("x"))[0], "is not a directory"),
    ],
    ids=["missing", "not-vllm", "a-file"],
)
def test_not_a_vllm_tree_is_one_line(tmp_path, capsys, make, message):
    code, out, err = run(capsys, str(make(tmp_path)))
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda t: (t / "vllm/_version.py").write_text("version = 0.33\n"),
            "_version.py gives no version string ('version = 0.33'; vLLM writes __version__",
        ),
        (
            lambda t: ((t / "vllm/_version.py").unlink(), (t / "vllm/_version.py").mkdir()),
            "vllm/_version.py is a directory, not vLLM's version file",
        ),
        (
            lambda t: ((t / upstream.ROCM_ATTN).unlink(), (t / upstream.ROCM_ATTN).mkdir()),
            "rocm_attn.py is a directory, not vLLM's file",
        ),
    ],
    ids=["unquoted-version", "version-dir", "rocm-attn-dir"],
)
def test_a_damaged_tree_is_named_for_what_is_wrong(tree, capsys, damage, message):
    damage(tree)
    for argv in ((str(tree), "--check"), (str(tree),)):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and message in err and err.count("\n") == 1, err


def test_the_vllm_package_given_for_its_tree_names_the_parent(tree, capsys):
    code, _, err = run(capsys, str(tree / "vllm"))
    assert code == 2 and err.count("\n") == 1
    assert f"is the vllm package itself; give the directory that holds it ({tree.resolve()})" in err


def test_an_installed_vllm_package_is_told_to_write_into_a_copy(tree, capsys):
    """Its parent (site-packages) would be refused as an installed vLLM: say that at once."""
    (tree / "vllm-0.33.0.dist-info").mkdir()
    code, _, err = run(capsys, str(tree / "vllm"))
    assert code == 2 and err.count("\n") == 1
    assert "is an installed vLLM package; write into a git checkout, or into a copy" in err


def test_the_git_hint_only_for_a_git_checkout(tree, capsys, monkeypatch, tmp_path_factory):
    """In a git checkout, the next step from the checkout's top (git diff names files
    from there, pre-commit reads them from there), whatever the directory of the run."""
    code, out, _ = run(capsys, str(tree))
    assert code == 0 and "changed:" in out and "next:" not in out
    top = tmp_path_factory.mktemp("it's a checkout")  # a name the shell must quote
    other = stock_tree(top / "src")  # DIR below the checkout's top
    subprocess.run(["git", "init", "-q", str(top)], check=True)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    code, out, _ = run(capsys, str(other))
    hint = out.split("\n--- pull-request text")[0].splitlines()[-1]
    top = shlex.quote(str(top.resolve()))
    assert code == 0 and hint == (
        f"next: cd {top} && git add -A && pre-commit run --files $(git diff --cached --name-only)"
    )


@pytest.mark.slow  # two processes, one held
def test_a_run_that_read_the_tree_keeps_the_next_run_out_until_it_has_written(tree, monkeypatch):
    """Run B (stage 1) has read the stock files and is about to write when run A (stage
    3) starts. Unlocked, A writes stage 3 and B then puts its stage-1 ``rocm_attn.py``
    over A's: a tree of two stages. Locked, A waits for B and stacks stage 3 on it."""
    reference = stock_tree(tree.parent / "reference")
    upstream.apply(reference, 3)
    read, a_done = threading.Event(), threading.Event()
    real_plan = upstream._plan

    def plan(root, stage):
        files = real_plan(root, stage)
        if threading.current_thread().name == "run-b":
            read.set()
            a_done.wait(timeout=1.0)  # A, if it is not kept out, writes meanwhile
        return files

    monkeypatch.setattr(upstream, "_plan", plan)
    b = threading.Thread(target=upstream.apply, args=(tree, 1), name="run-b")
    b.start()
    assert read.wait(timeout=30)
    upstream.apply(tree, 3)
    a_done.set()
    b.join(timeout=30)
    assert snapshot(tree) == snapshot(reference)


@pytest.mark.slow
def test_runs_at_once_on_one_tree_all_succeed_and_agree(tree):
    """Three processes writing into one tree at the same time, as three shells would,
    one of them stage 1 only: they take turns, so the tree ends as stage 3 whichever
    goes first."""
    reference = stock_tree(tree.parent / "reference")
    upstream.apply(reference, 3)
    go = tree.parent / "go"
    # Each process loads the command, then waits for the others: the runs overlap.
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from vllm_rocm_asm_decode.tools.cli import main\n"
        "while not Path(sys.argv[1]).exists():\n"
        "    time.sleep(0.001)\n"
        "sys.exit(main(['upstream', sys.argv[2], '--stage', sys.argv[3]]))\n"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(go), str(tree), stage],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for stage in ("1", "3", "3")
    ]
    time.sleep(1.0)
    go.touch()
    results = [(run.wait(timeout=120), run.stderr.read().decode()) for run in runs]
    for run in runs:
        run.stdout.close()
        run.stderr.close()
    assert results == [(0, "")] * 3
    assert snapshot(tree) == snapshot(reference)


@pytest.mark.parametrize("stage", [1, 2, 3], ids=["stage-1", "stage-2", "stage-3"])
def test_the_pull_request_texts_are_short_shipped_and_in_the_docs(stage):
    """What ``upstream`` prints after writing a stage: a title line, then at most ~60
    lines for the first pull request; no word of the plugin's own tools; stage 3 says
    it is a proposal; the same text in docs/upstream.md."""
    text = upstream.pr_text(stage)
    title, blank, *body = text.splitlines()
    assert title.startswith(("[ROCm]", "[RFC]")) and blank == "" and len(body) >= 10
    assert len(text.splitlines()) <= (60 if stage == 1 else 40)
    for word in ("vllm-rocm-asm-decode", "plugin", "doctor", " plan ", "contract model"):
        assert word not in text, (stage, word)
    if stage == 1:  # the claims are the original measurements, the limits are stated
        dash, micro, at_least = "\u2013", "\u00b5", "\u2265"
        facts = (f"+4.2{dash}6.3 %", f"+6.2{dash}8.8 %", "AITER 0.1.27", "optional")
        facts += (
            "PIECEWISE graphs",
            "ROCM_AITER_FA",
            "Off by default",
            "fp16",
            f"20.0{dash}20.6 {micro}s",
        )
        facts += (f"AITER {at_least} 0.1.17", "issue 3062", f"1{dash}16 unchanged")
        facts += ("0.9239 \u2192 0.9213", "default precision", "40960", "cudagraph_mode=FULL")
        facts += (
            "output_scale",
            "two to four",
            "gqa8",
            "**Tests** (21, ROCm only; 4 need no GPU)",
            "DBO: two builders",
            "17 GPU tests",
        )
        facts += ("Not a duplicate", "AI-assisted", "max_page_id")
        flat = " ".join(text.split())  # as a reader reads it, whatever the wrapping
        for fact in facts:
            assert fact in flat, fact
    if stage == 3:
        assert "A proposal" in text and "C++ allocator" in text and "pa_fwd" in text
    docs = (Path(__file__).parents[2] / "docs/upstream.md").read_text(encoding="utf-8")
    assert text in docs


@pytest.mark.slow  # a process and a tree copy
def test_a_closed_stdout_after_writing_is_one_line_and_exit_1(tree):
    """``upstream DIR >&-``: the tree is written whole, then the report cannot go out."""
    from test_cli_input import run_with_closed

    proc = run_with_closed("upstream", str(tree))
    assert (proc.returncode, proc.stderr.splitlines()) == (
        1,
        ["vllm-rocm-asm-decode upstream: error: cannot write to stdout: Bad file descriptor"],
    )
    assert upstream.main(str(tree), True) == 0  # carries stage 1 whole


def test_check_names_a_file_a_real_run_could_not_write(tree, capsys, monkeypatch):
    """--check probes each directory it would write into, as the real run writes: a
    probe that fails (read-only mount, permissions) is the real run's error, exit 2."""
    import tempfile

    real = tempfile.mkstemp
    backends = (tree / upstream.ROCM_ATTN).parent.resolve()

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == backends:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    before = snapshot(tree)
    code, out, err = run(capsys, str(tree), "--check")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"cannot write {tree / upstream.ROCM_ATTN}: Permission denied; a real run" in err
    code, _, err = run(capsys, str(tree))
    assert code == 2 and f"cannot write {tree / upstream.ROCM_ATTN}" in err
    assert "no file was changed" in err and snapshot(tree) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file modes")
def test_check_on_a_read_only_tree_says_so(tree, capsys):
    backends = (tree / upstream.ROCM_ATTN).parent
    backends.chmod(0o555)
    try:
        code, _, err = run(capsys, str(tree), "--check")
    finally:
        backends.chmod(0o755)
    assert code == 2 and "Permission denied; a real run would fail" in err


def test_check_names_a_file_that_cannot_be_replaced(tree, capsys):
    """An immutable file (chattr +i) in a directory that takes new files: rename(2) over
    it fails with EPERM, so --check says so in one line, as the run then fails."""
    path = tree / upstream.ROCM_ATTN
    _chattr("+i", path)
    try:
        checked = run(capsys, str(tree), "--check")
        written = run(capsys, str(tree))
    finally:
        _chattr("-i", path)
    assert checked[:2] == (2, "") and checked[2].count("\n") == 1
    assert f"cannot write {path}: Operation not permitted; a real run would" in checked[2]
    assert written[0] == 2 and "Operation not permitted; no file was changed" in written[2]


def _chattr(flag: str, path: Path) -> None:
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, flag, path], capture_output=True).returncode:
        pytest.skip(f"chattr {flag} needs root and a file system with inode flags")


def test_check_judges_a_symlink_not_its_immutable_target(tree, capsys, tmp_path):
    """A run replaces a symlinked file by a file of its own: the target's flags do not
    stop it, so --check does not refuse them."""
    target = tmp_path / "elsewhere.py"
    (tree / upstream.ROCM_ATTN).rename(target)
    (tree / upstream.ROCM_ATTN).symlink_to(target)
    _chattr("+i", target)
    try:
        assert run(capsys, str(tree), "--check")[0] == 1
        assert run(capsys, str(tree))[0] == 0
    finally:
        _chattr("-i", target)


def test_check_on_an_append_only_directory_is_one_line(tree, capsys):
    """In a chattr +a directory a run's rename fails (EPERM); --check's probe file can be
    made there but not removed: one line that names it, no traceback."""
    backends = (tree / upstream.ROCM_ATTN).parent
    _chattr("+a", backends)
    try:
        code, out, err = run(capsys, str(tree), "--check")
    finally:
        _chattr("-a", backends)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "Operation not permitted (its probe " in err and "a real run would fail" in err


def test_check_names_a_file_of_another_user_in_a_sticky_directory(tree, capsys, monkeypatch):
    """A sticky directory (chmod +t) lets only the file's or the directory's owner (or
    root) rename over a file: as another user, --check refuses it."""
    backends = (tree / upstream.ROCM_ATTN).parent
    backends.chmod(0o1777)
    owner = (tree / upstream.ROCM_ATTN).stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + backends.stat().st_uid + 1)
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 2 and "Operation not permitted; a real run would fail" in err, err
    for uid in (owner, backends.stat().st_uid, 0):  # the file's, the directory's, root
        monkeypatch.setattr(os, "geteuid", lambda uid=uid: uid)
        assert run(capsys, str(tree), "--check")[0] == 1, uid  # would change
    backends.chmod(0o755)
    monkeypatch.setattr(os, "geteuid", lambda: owner + backends.stat().st_uid + 1)
    assert run(capsys, str(tree), "--check")[0] == 1  # not sticky: would change


# --------------------------------------------------------------------------------------
# Part of a stage, files of the user's, line endings, Ctrl-C, a closed stdout

STAGE_1_FIELD = "    use_asm_decode: bool = False  # pa_fwd_asm decodes this step\n"


def _drop(line: str):
    def damage(path: Path) -> None:
        text = path.read_text()
        assert text.count(line) == 1, line
        path.write_text(text.replace(line, ""))

    return damage


def _add_field(path: Path) -> None:
    text = path.read_text()
    anchor = "    causal: bool = True\n\n\nclass RocmAttentionMetadataBuilder("
    assert text.count(anchor) == 1
    field = "    asm_scales: dict | None = None\n"
    path.write_text(text.replace(anchor, anchor.replace("\n\n\n", "\n" + field + "\n\n", 1)))


PARTS = {
    # A stage-1 tree with the metadata's use_asm_decode field deleted by hand.
    "stage-1-field-deleted": (
        1,
        upstream.ROCM_ATTN,
        _drop(STAGE_1_FIELD),
        "carries part of stage 1: it lacks the edit of RocmAttentionMetadata ("
        f"{STAGE_1_FIELD.strip()!r} is not there) and has the rest",
    ),
    "stage-1-keyword-deleted": (
        1,
        upstream.AITER_OPS,
        _drop("            high_precision=high_precision,\n"),
        "carries part of stage 1: it lacks the edit of rocm_aiter_ops.pa_fwd_asm",
    ),
    "stage-2-field-deleted": (
        2,
        upstream.ROCM_ATTN,
        _drop("    asm_split: _AsmDecodeSplit | None = None\n"),
        "carries part of stage 2: it lacks the edit of RocmAttentionMetadata ("
        "'asm_split: _AsmDecodeSplit | None = None' is not there) and has the rest",
    ),
    "stage-1-metadata-keyword-deleted": (
        1,
        upstream.ROCM_ATTN,
        _drop("            use_asm_decode=use_asm,\n"),
        "carries part of stage 1: it lacks the edit of `use_asm_decode=use_asm` and has the rest",
    ),
    "stage-1-import-deleted": (
        1,
        upstream.ROCM_ATTN,
        lambda path: path.write_text(
            path.read_text().replace(
                "from vllm.config import ModelConfig, VllmConfig\n",
                "from vllm.config import VllmConfig\n",
            )
        ),
        "carries part of stage 1: it lacks the edit of the import of ModelConfig and has the rest",
    ),
    # A stock tree where one field of stage 1 was written by hand.
    "stage-1-field-by-hand": (
        0,
        upstream.ROCM_ATTN,
        _add_field,
        "carries part of stage 1: it defines RocmAttentionMetadata.asm_scales already, "
        "which stage 1 adds",
    ),
}


@pytest.mark.parametrize("case", list(PARTS), ids=list(PARTS))
def test_a_tree_with_part_of_a_stage_is_refused_not_stacked(tree, capsys, case):
    carried, rel, damage, message = PARTS[case]
    if carried:
        upstream.apply(tree, carried)
    damage(tree / rel)
    before = snapshot(tree)
    stage = str(max(carried, 1))
    for argv in ((str(tree), "--stage", stage), (str(tree), "--stage", stage, "--check")):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"vllm-rocm-asm-decode upstream: error: {tree / rel}: {message}"), err
        assert f"copy {rel} from an unmodified vLLM 0.33.x" in err  # not a git tree
    assert snapshot(tree) == before


def test_a_hand_edit_is_named_by_its_line_on_disk(tree, capsys):
    """The run re-adds a deleted import in memory before it meets the edited line: the
    line number is still the file's own."""
    upstream.apply(tree)
    path = tree / upstream.ROCM_ATTN
    text = path.read_text()
    text = text.replace("from packaging.version import Version\n", "")
    old = "self._asm_cut = 0  # set when the layers are bound (build())"
    new = "self._asm_cut = 0  # set later"
    path.write_text(text.replace(old, new))
    line = 1 + next(i for i, x in enumerate(path.read_text().splitlines()) if new in x)
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 2 and f"(line {line} reads {new!r} where it writes {old!r})" in err, err


def test_in_a_git_checkout_the_hint_is_gits_checkout(tree, capsys):
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    upstream.apply(tree)
    path = tree / upstream.ROCM_ATTN
    path.write_text(path.read_text().replace("_ASM_MAX_GQA = 8", "_ASM_MAX_GQA = 9"))
    code, _, err = run(capsys, str(tree))  # a file git does not track: git cannot restore it
    assert code == 2 and f"(copy {upstream.ROCM_ATTN} from an unmodified vLLM 0.33.x)" in err
    subprocess.run(["git", "-C", str(tree), "add", "--", str(upstream.ROCM_ATTN)], check=True)
    for argv in ((str(tree),), (str(tree), "--check")):  # --check judges the tree itself
        code, _, err = run(capsys, *argv)
        assert code == 2 and f"(git -C {tree} checkout -- {upstream.ROCM_ATTN})" in err, err


def test_on_a_branch_that_committed_an_older_stage_the_hint_names_the_release_tag(tree, capsys):
    """(trial 24) The stage committed by an older ``upstream``: ``git checkout -- FILE``
    would give back the committed file, so the hint checks vLLM's own out of the tag."""
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "vLLM"], check=True)
    subprocess.run([*git, "tag", "v0.33.0"], check=True)
    upstream.apply(tree)
    path = tree / upstream.ROCM_ATTN
    path.write_text(path.read_text().replace("_ASM_MAX_GQA = 8", "_ASM_MAX_GQA = 9"))
    subprocess.run([*git, "commit", "-qam", "stage 1, edited"], check=True)
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 2, err
    assert f"(git -C {tree} checkout v0.33.0 -- {upstream.ROCM_ATTN}, vLLM's release tag)" in err
    subprocess.run([*git, "tag", "-d", "v0.33.0"], check=True, capture_output=True)
    code, _, err = run(capsys, str(tree), "--check")
    assert f"checkout <the commit before the change> -- {upstream.ROCM_ATTN}; it is" in err


@pytest.mark.parametrize(
    ("rel", "stage"),
    [(upstream.KERNEL_TEST, "1"), (upstream.SCALE_TABLES, "3")],
    ids=["kernel-test", "scale-tables"],
)
def test_a_file_of_the_users_where_a_new_file_goes_is_refused(tree, capsys, rel, stage):
    (tree / rel).parent.mkdir(parents=True, exist_ok=True)
    (tree / rel).write_text("# my test\n")
    before = snapshot(tree)
    for argv in ((str(tree), "--stage", stage), (str(tree), "--stage", stage, "--check")):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert f"{tree / rel} is there already and is not the file stage " in err, err
        assert "(line 1 reads '# my test' where it writes '# SPDX-License-Identifier" in err
        assert "move it aside" in err and "nothing written" in err
    assert snapshot(tree) == before


def test_a_hand_edit_of_the_written_test_file_is_named_by_its_line(tree, capsys):
    upstream.apply(tree)
    path = tree / upstream.KERNEL_TEST
    lines = path.read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if line == "import torch\n")
    lines[n] = "# import torch\n"
    path.write_text("".join(lines))
    code, _, err = run(capsys, str(tree), "--check")
    assert f"(line {n + 1} reads '# import torch' where it writes 'import torch')" in err
    path.write_text("".join(lines[:n]))  # cut short there
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 2 and f"(it ends at line {n}, where it writes on)" in err, err


def test_the_git_checkout_hint_quotes_the_tree(tmp_path_factory, capsys):
    """The hint is run as written: a tree whose path has a space and a quote gets it
    quoted as a shell reads it."""
    top = tmp_path_factory.mktemp("it's a tree")
    tree = stock_tree(top / "vllm src")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True)
    upstream.apply(tree)
    path = tree / upstream.ROCM_ATTN
    path.write_text(path.read_text().replace("_ASM_MAX_GQA = 8", "_ASM_MAX_GQA = 9"))
    code, _, err = run(capsys, str(tree))
    hint = f"(git -C {shlex.quote(str(tree))} checkout -- {upstream.ROCM_ATTN})"
    assert code == 2 and hint in err and "'\"'\"'" in hint, err


def test_a_new_file_already_there_as_upstream_writes_it_is_left_alone(tree, capsys):
    reference = stock_tree(tree.parent / "reference")
    upstream.apply(reference, 3)
    for rel in (upstream.KERNEL_TEST, upstream.SCALE_TABLES):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(reference / rel, tree / rel)
    code, out, _ = run(capsys, str(tree), "--stage", "3")
    stat = out.split("\n--- pull-request text")[0]
    assert code == 0 and "5 files changed" in stat, stat
    assert "(new)" not in stat and "asm_scale_tables.py" not in stat
    assert snapshot(tree) == snapshot(reference)


def _crlf(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))


def test_crlf_line_endings_are_kept(tree, capsys):
    """A checkout with CRLF endings (git's autocrlf) gets CRLF lines: the same change as
    an LF tree, every line ending CRLF; a second run, and a kernel test turned CRLF by
    git, then have nothing to do."""
    reference = stock_tree(tree.parent / "reference")
    upstream.apply(reference, 2)
    for rel in (upstream.ROCM_ATTN, upstream.AITER_OPS, upstream.ATTENTION_CONFIG):
        _crlf(tree / rel)
    _crlf(tree / upstream.PAGED_DECODE)
    code, out, _ = run(capsys, str(tree), "--stage", "2")
    assert code == 0 and "5 files changed" in out
    for rel in (
        upstream.ROCM_ATTN,
        upstream.AITER_OPS,
        upstream.ATTENTION_CONFIG,
        upstream.PAGED_DECODE,
    ):
        raw = (tree / rel).read_bytes()
        assert raw.count(b"\n") == raw.count(b"\r\n") > 100, rel
        assert raw.replace(b"\r\n", b"\n") == (reference / rel).read_bytes(), rel
    assert (tree / upstream.KERNEL_TEST).read_bytes() == (
        reference / upstream.KERNEL_TEST
    ).read_bytes()
    _crlf(tree / upstream.KERNEL_TEST)
    after = snapshot(tree)
    for argv in ((str(tree), "--stage", "2"), (str(tree), "--stage", "2", "--check")):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and out.endswith(
            "already carries stages 1-2 of this change; nothing to do\n"
        )
    assert snapshot(tree) == after


def test_mixed_line_endings_are_refused_in_one_line(tree, capsys):
    path = tree / upstream.ROCM_ATTN
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n", 3))
    before = snapshot(tree)
    code, out, err = run(capsys, str(tree))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{path} mixes line endings (CRLF with LF or a lone CR)" in err
    assert "(dos2unix, or git checkout -- the file in a git tree)" in err
    assert snapshot(tree) == before


def _dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_dir())


def _nth_call(n: int, real, then):
    """``real`` with its ``n``-th call preceded by ``then()``."""
    calls = []

    def call(*args, **kwargs):
        calls.append(args)
        if len(calls) == n:
            then()
        return real(*args, **kwargs)

    return call


def _interrupt() -> None:
    raise KeyboardInterrupt


NOTHING = "vllm-rocm-asm-decode upstream: interrupted; nothing was written to {}\n"
WRITTEN = (
    "vllm-rocm-asm-decode upstream: interrupted; {} was written: it carries stage 1 "
    "(4 files changed)\n"
)


@pytest.mark.parametrize(
    "where", ["staging-2nd-file", "replacing-2nd-file"], ids=["staging", "replacing"]
)
def test_ctrl_c_before_every_file_is_in_place_writes_nothing(tree, capsys, monkeypatch, where):
    """Ctrl-C while the new texts are staged, or between two files moved into place:
    every file as it was, no staged file or new directory left, and the message says
    nothing was written."""
    if where.startswith("staging"):
        patched = _nth_call(2, upstream.tempfile.mkstemp, _interrupt)
        monkeypatch.setattr(upstream.tempfile, "mkstemp", patched)
    else:
        monkeypatch.setattr(upstream.os, "replace", _nth_call(2, os.replace, _interrupt))
    before, dirs = snapshot(tree), _dirs(tree)
    code, out, err = run(capsys, str(tree))
    assert code == 130 and out == "" and err == NOTHING.format(tree)
    assert snapshot(tree) == before and _dirs(tree) == dirs


def test_a_sigint_while_files_are_moved_into_place_takes_effect_once_all_are(
    tree, capsys, monkeypatch
):
    """A real SIGINT between two files moved into place is held back: the tree is
    written whole, then the run stops at 130 saying so."""
    import signal

    reference = stock_tree(tree.parent / "reference")
    upstream.apply(reference, 1)
    sigint = _nth_call(1, os.replace, lambda: signal.raise_signal(signal.SIGINT))
    monkeypatch.setattr(upstream.os, "replace", sigint)
    code, out, err = run(capsys, str(tree))
    assert code == 130 and out == "" and err == WRITTEN.format(tree)
    assert snapshot(tree) == snapshot(reference)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_printing_says_the_tree_was_written(tree, capsys, monkeypatch):
    reference = stock_tree(tree.parent / "reference")
    upstream.apply(reference, 1)
    monkeypatch.setattr(upstream, "pr_text", lambda stage: _interrupt())
    code, out, err = run(capsys, str(tree))
    assert code == 130 and "changed:" in out and err == WRITTEN.format(tree)
    assert snapshot(tree) == snapshot(reference)


def test_a_sigterm_says_so(tree, capsys, monkeypatch):
    """SIGTERM (``timeout``, a scheduler), which the command line raises as its Ctrl-C:
    the same outcome, exit 143, and the line names it."""
    import signal

    monkeypatch.setattr(upstream, "pr_text", lambda stage: signal.raise_signal(signal.SIGTERM))
    code, out, err = run(capsys, str(tree))
    assert code == 143 and "changed:" in out
    assert err == WRITTEN.format(tree).replace("interrupted", "terminated (SIGTERM)")


def test_ctrl_c_during_check_says_nothing_was_written(tree, capsys, monkeypatch):
    monkeypatch.setattr(upstream, "diff_stat", lambda changes: _interrupt())
    before = snapshot(tree)
    code, _, err = run(capsys, str(tree), "--check")
    assert code == 130 and err == NOTHING.format(tree)
    assert snapshot(tree) == before


@pytest.mark.slow  # a process and a tree copy a case
@pytest.mark.parametrize("check", [False, True], ids=["write", "check"])
def test_a_closed_stdout_ends_quietly_after_writing(tree, check):
    """``upstream DIR | head -0``: stdout is closed before anything is printed; the tree
    is written whole (or, with --check, left alone), no traceback, exit 141 as every
    command whose reader went away."""
    status = 141
    reference = stock_tree(tree.parent / "reference")
    if not check:
        upstream.apply(reference, 1)
    command = Path(sys.executable).with_name("vllm-rocm-asm-decode")
    proc = subprocess.Popen(
        [str(command), "upstream", str(tree), *(["--check"] if check else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before the command prints
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == status and err == "", err
    assert snapshot(tree) == snapshot(reference)


def test_ctrl_c_after_the_last_line_is_printed_does_not_kill_the_command_silently(tree):
    """A SIGINT once everything is printed (Python then tears its modules down) ends
    the command with the status of the write, not by the signal without a word."""
    import signal

    last = upstream.pr_text(1).rstrip("\n").splitlines()[-1]
    command = Path(sys.executable).with_name("vllm-rocm-asm-decode")
    proc = subprocess.Popen(
        [str(command), "upstream", str(tree)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        if line.rstrip("\n") == last:
            break
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    code = proc.wait(timeout=120)
    assert code == 0 and err == "", (code, err)
    assert "def _asm_decode_rejections(" in (tree / upstream.ROCM_ATTN).read_text()


@pytest.mark.parametrize(
    ("old", "new", "counts"),
    [
        ("a\nb\nc\n", "a\nb\nc\n", (0, 0)),
        ("", "x\ny\n", (2, 0)),
        ("a\nb\nc\nd\n", "a\nc\nd\ne\n", (1, 1)),
        ("x\n}\nx\n", "}\ny\nx\n", (1, 1)),  # difflib's matcher counts 2 and 2
    ],
    ids=["same", "new-file", "one-each", "not-difflib"],
)
def test_diff_counts_are_a_shortest_edit_script(old, new, counts):
    """What ``git diff --stat`` counts (checked by hand): lines added and removed by a
    shortest edit script."""
    assert upstream.diff_counts(old, new) == counts


@given(st.lists(st.sampled_from("xy}"), max_size=12), st.lists(st.sampled_from("xy}"), max_size=12))
def test_diff_counts_leave_the_longest_common_subsequence(a, b):
    common = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]  # the LCS table, by hand
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            common[i + 1][j + 1] = (
                common[i][j] + 1 if x == y else max(common[i][j + 1], common[i + 1][j])
            )
    lcs = common[-1][-1]
    text = lambda lines: "".join(f"{line}\n" for line in lines)  # noqa: E731
    assert upstream.diff_counts(text(a), text(b)) == (len(b) - lcs, len(a) - lcs)

"""``upstream DIR``: the in-tree form written from the runtime modules into a vLLM 0.33
tree (here: the installed vLLM's three edited files and its version file), anchored on
names, all or nothing, idempotent, refused for other vLLMs."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from vllm_rocm_asm_decode.tools import upstream
from vllm_rocm_asm_decode.tools.cli import main

RUNTIME = Path(upstream.__file__).resolve().parents[2]
EDITED = (upstream.ROCM_ATTN, upstream.AITER_OPS, upstream.ENVS)


def installed_vllm() -> Path:
    spec = find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


@pytest.fixture
def tree(tmp_path) -> Path:
    """The files ``upstream`` reads, copied from the installed vLLM 0.33."""
    root = tmp_path / "vllm-src"
    for rel in (*EDITED, Path("vllm/_version.py")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_vllm().parent / rel, root / rel)
    return root


@pytest.fixture(scope="module")
def applied(tmp_path_factory) -> Path:
    """A tree with the change applied (read only)."""
    root = tmp_path_factory.mktemp("applied") / "vllm-src"
    for rel in (*EDITED, Path("vllm/_version.py")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_vllm().parent / rel, root / rel)
    upstream.apply(root)
    return root


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
    assert checked.splitlines()[1:] == applied.splitlines()[1:-1]  # the same diff stat
    assert "12 files changed" in applied and "(new)" in applied
    after = snapshot(tree)
    for argv in ((str(tree),), (str(tree), "--check")):
        code, again, _ = run(capsys, *argv)
        assert code == 0 and again.endswith("already carries this change; nothing to do\n")
        assert snapshot(tree) == after


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
        if len(calls) == 11:  # after the package and rocm_attn.py went in
            raise PermissionError(1, "Operation not permitted")
        real(src, dst)

    monkeypatch.setattr(upstream.os, "replace", replace)
    before = snapshot(tree)
    dirs_before = sorted(p for p in tree.rglob("*") if p.is_dir())
    code, _, err = run(capsys, str(tree))
    assert code == 2 and "Operation not permitted; no file was changed" in err, err
    assert snapshot(tree) == before
    assert sorted(p for p in tree.rglob("*") if p.is_dir()) == dirs_before


def test_file_modes_are_kept(tree):
    (tree / upstream.ENVS).chmod(0o755)
    upstream.apply(tree)
    assert (tree / upstream.ENVS).stat().st_mode & 0o777 == 0o755


def test_a_symlink_into_an_installed_vllm_is_refused(tree, tmp_path, capsys):
    site = tmp_path / "site-packages"
    site.mkdir()
    (tree / "vllm").rename(site / "vllm")
    (site / "vllm-0.33.0.dist-info").mkdir()
    (tree / "vllm").symlink_to(site / "vllm")
    before = snapshot(site)
    code, _, err = run(capsys, str(tree))
    assert code == 2 and "holds an installed vLLM" in err and "dist-info" in err
    assert snapshot(site) == before


def test_a_symlinked_file_is_replaced_not_written_through(tree, tmp_path):
    outside = tmp_path / "installed_rocm_attn.py"
    (tree / upstream.ROCM_ATTN).rename(outside)
    (tree / upstream.ROCM_ATTN).symlink_to(outside)
    original = outside.read_bytes()
    upstream.apply(tree)
    assert outside.read_bytes() == original
    assert not (tree / upstream.ROCM_ATTN).is_symlink()
    assert "forward_asm_decode" in (tree / upstream.ROCM_ATTN).read_text()


@pytest.mark.parametrize("base_order_swapped", [False, True], ids=["comment", "bases"])
def test_another_version_of_the_change_is_refused_not_stacked(tree, capsys, base_order_swapped):
    upstream.apply(tree)
    if base_order_swapped:
        path = tree / upstream.ROCM_ATTN
        path.write_text(
            path.read_text().replace(
                "class RocmAttentionImpl(AsmDecodeImplMixin, AttentionImpl):",
                "class RocmAttentionImpl(AttentionImpl, AsmDecodeImplMixin):",
            )
        )
        code, _, err = run(capsys, str(tree))
        assert code == 2 and "another version of this change is in the bases" in err
        return
    path = tree / upstream.ROCM_ATTN
    path.write_text(path.read_text().replace("keep theirs.", "keep their decode."))
    before = snapshot(tree)
    code, _, err = run(capsys, str(tree))
    assert (
        code == 2
        and "another version of this change is in RocmAttentionMetadataBuilder.__init__" in err
    )
    assert f"git checkout -- {upstream.ROCM_ATTN}" in err and snapshot(tree) == before


@pytest.mark.parametrize(
    ("damage", "message"),
    [(b"# caf\xe9\n", "is not UTF-8 text"), (None, "is not a vLLM source tree")],
    ids=["latin-1-byte", "envs-missing"],
)
def test_unreadable_files_are_one_line(tree, capsys, damage, message):
    if damage is None:
        (tree / upstream.ENVS).unlink()
    else:
        with open(tree / upstream.ROCM_ATTN, "ab") as f:
            f.write(damage)
    for argv in ((str(tree),), (str(tree), "--check")):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "" and message in err and err.count("\n") == 1, err
        assert str(tree) in err and "upstream-check" not in err  # names DIR, not the copy


def test_the_three_vllm_files_only_gain_lines_except_where_a_line_is_rewrapped(tree):
    import difflib

    before = {rel: (tree / rel).read_text().splitlines() for rel in EDITED}
    upstream.apply(tree)
    removed = {
        rel: [
            line[1:]
            for line in difflib.unified_diff(old, (tree / rel).read_text().splitlines(), n=0)
            if line.startswith("-") and not line.startswith("---") and line[1:].strip()
        ]
        for rel, old in before.items()
    }
    assert removed[upstream.AITER_OPS] == [] and removed[upstream.ENVS] == []
    # rocm_attn.py: the two class lines and the capture build's call are rewritten.
    assert [line.strip() for line in removed[upstream.ROCM_ATTN]] == [
        "class RocmAttentionMetadataBuilder(AttentionMetadataBuilder[RocmAttentionMetadata]):",
        "attn_metadata = self.build(0, common_attn_metadata)",
        "class RocmAttentionImpl(AttentionImpl):",
    ]


def _code(source: str) -> list[str]:
    """A module's statements, imports and the logger assignment left out, as AST."""
    body = ast.parse(source).body
    kept = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Assign) and ast.unparse(node) == "logger = init_logger(__name__)":
            continue
        for inner in ast.walk(node):  # imports inside functions are rewritten: drop them
            if isinstance(inner, ast.ImportFrom):
                inner.module, inner.level = "", 0
        kept.append(ast.dump(node))
    return kept


@pytest.mark.parametrize("name", upstream.RUNTIME_MODULES)
def test_each_written_module_is_the_runtime_module(applied, name):
    written = (applied / upstream.PACKAGE_DIR / f"{name}.py").read_text()
    original = (RUNTIME / f"{name}.py").read_text()
    assert written.startswith(upstream.SPDX)
    assert _code(written) == _code(original)
    imported = [
        n.module or "" for n in ast.walk(ast.parse(written)) if isinstance(n, ast.ImportFrom)
    ]
    assert all(n.level == 0 for n in ast.walk(ast.parse(written)) if isinstance(n, ast.ImportFrom))
    assert not [m for m in imported if m.startswith("vllm_rocm_asm_decode")]


def test_nothing_only_the_plugin_needs_goes_in(applied):
    written = [applied / upstream.KERNEL_TEST, *(applied / upstream.PACKAGE_DIR).glob("*.py")]
    for path in written:
        text = path.read_text()
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
    names = {p.stem for p in (applied / upstream.PACKAGE_DIR).glob("*.py")}
    assert names == {"__init__", *upstream.RUNTIME_MODULES}
    assert not names & set(upstream.PLUGIN_ONLY)


def test_what_it_writes_is_ruff_clean_at_vllms_settings(applied, tmp_path):
    """vLLM's line length (88) and lint families, vLLM as first party."""
    config = tmp_path / "ruff.toml"
    config.write_text(
        "line-length = 88\ntarget-version = 'py310'\n[lint]\n"
        "select = ['E', 'F', 'UP', 'B', 'SIM', 'I', 'G']\n"
        "[lint.isort]\nknown-first-party = ['vllm']\n"
    )
    written = [applied / upstream.KERNEL_TEST, *(applied / upstream.PACKAGE_DIR).glob("*.py")]
    ruff = Path(sys.executable).with_name("ruff")
    files = [str(p) for p in written]
    lint = subprocess.run(
        [str(ruff), "check", "--config", str(config), *files], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout
    # The edited vLLM files as well as the new ones are as ruff format writes them.
    files += [str(applied / rel) for rel in EDITED]
    fmt = subprocess.run(
        [str(ruff), "format", "--check", "--config", str(config), *files],
        capture_output=True,
        text=True,
    )
    assert fmt.returncode == 0, fmt.stdout


MOVED = {
    "capture-def": (
        upstream.ROCM_ATTN,
        "def build_for_cudagraph_capture(",
        "def build_for_graphs(",
        "def build_for_cudagraph_capture not found in RocmAttentionMetadataBuilder",
    ),
    "impl-class": (
        upstream.ROCM_ATTN,
        "class RocmAttentionImpl(AttentionImpl):",
        "class RocmImpl(AttentionImpl):",
        "class RocmAttentionImpl not found in module",
    ),
    "build-return": (
        upstream.ROCM_ATTN,
        "        )\n        return attn_metadata\n\n\nclass RocmAttentionBackend",
        "        )\n        return attn_metadata or None\n\n\nclass RocmAttentionBackend",
        "RocmAttentionMetadataBuilder.build does not end in `return attn_metadata`",
    ),
    "forward-args": (
        upstream.ROCM_ATTN,
        "        output_block_scale: torch.Tensor | None = None,\n    ) -> torch.Tensor:\n"
        '        """Forward pass with FlashAttention.',
        "        block_scale: torch.Tensor | None = None,\n    ) -> torch.Tensor:\n"
        '        """Forward pass with FlashAttention.',
        "RocmAttentionImpl.forward(self, layer, query, key, value, kv_cache, "
        "attn_metadata, output, output_scale, block_scale)",
    ),
    "pa-out": (
        upstream.AITER_OPS,
        '        out_: torch.Tensor,\n    ):\n        """Paged attention forward pass using '
        "assembly kernel.",
        '        out: torch.Tensor,\n    ):\n        """Paged attention forward pass using '
        "assembly kernel.",
        "rocm_aiter_ops.pa_fwd_asm: out_ is not its last argument",
    ),
    "mha-env": (
        upstream.ENVS,
        "    VLLM_ROCM_USE_AITER_MHA: bool = True\n",
        "",
        "VLLM_ROCM_USE_AITER_MHA is not declared under TYPE_CHECKING",
    ),
}


@pytest.mark.parametrize("case", list(MOVED), ids=list(MOVED))
def test_a_moved_anchor_stops_with_one_line_and_writes_nothing(tree, capsys, case):
    rel, old, new, anchor = MOVED[case]
    path = tree / rel
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    before = snapshot(tree)
    code, out, err = run(capsys, str(tree))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("vllm-rocm-asm-decode upstream: error: ")
    assert f"{rel}: anchor moved: {anchor}" in err, err
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    ("version", "ok"),
    [("0.33.0", True), ("0.33.2rc1.dev5+gabc", True), ("0.34.0", False), ("0.3.3", False)],
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

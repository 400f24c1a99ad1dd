"""Which layers' scale tables fit in free device memory (the rule of ``fit_tables``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_rocm_asm_decode.scale_tables import fit_tables, table_bytes

BLOCKS = [64, 1000]
keys = st.builds(
    lambda blocks, scale, owner: ("cuda:0", blocks, 8, 16, scale, owner),
    st.sampled_from(BLOCKS),
    st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0]),
    st.sampled_from(["", "model.layers.0.self_attn.attn"]),  # shared, or a layer's own
)
requests = st.lists(st.tuples(keys, keys), max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    reqs=requests,
    existing=st.lists(keys, max_size=3),
    free=st.one_of(st.none(), st.integers(0, 400_000)),
    margin=st.sampled_from([0, 50_000]),
)
def test_budget_properties(reqs, existing, free, margin):
    budget = fit_tables(reqs, free, existing, margin)
    assert len(budget.fits) == len(reqs)
    assert budget.tables == len({k for r in reqs for k in r})
    assert budget.bytes == sum(table_bytes(k) for k in {k for r in reqs for k in r})
    have = set(existing)
    spent = 0
    for (k, v), fits in zip(reqs, budget.fits, strict=True):
        adds = {k, v} - have
        cost = sum(table_bytes(key) for key in adds)
        if free is None or not adds:
            assert fits  # nothing to allocate, or no figure to hold it against
        if fits:
            have |= adds
            spent += cost
        else:
            # It did not fit: what it adds exceeds what the earlier layers left.
            assert free is not None and cost > free - margin - spent
    assert budget.new_bytes == spent
    if free is not None:
        assert spent <= max(free - margin, 0)

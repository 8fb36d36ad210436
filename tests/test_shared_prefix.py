"""learner/model/shared_prefix.py: a group's rows packed as a prefix tree give the unpacked logprobs and
gradients (tiny real model), the layout is what the docstring says, and packing is declined when
it would not pay."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.learner.model.policy import load_causal_lm
from agentgym.learner.model.shared_prefix import attention_cost_ratio, pack_groups


def _rows(prompts: list[list[int]], tails: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs, groups = [], []
    for g, (p, ts) in enumerate(zip(prompts, tails, strict=True)):
        for t in ts:
            seqs.append(p + t)
            groups.append(g)
    T = max(map(len, seqs))
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    return ids, torch.tensor([len(s) for s in seqs]), torch.tensor(groups)


def test_layout_shares_the_prefix_and_keeps_each_rows_positions() -> None:
    ids, lengths, groups = _rows([[5, 6, 7]], [[[8, 9], [10]]])
    pk = pack_groups(ids, lengths, groups, ratio=0.0)
    assert pk is not None
    assert pk.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    assert (pk.unpacked_tokens, pk.packed_tokens) == (9, 6)
    assert pk.where.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 5, -1]]
    allowed = pk.allowed[0, 0]
    assert allowed[5].tolist() == [True, True, True, False, False, True]  # row 1's token: prefix + itself
    assert allowed[4].tolist() == [True, True, True, True, True, False]


def test_a_row_that_is_a_prefix_of_another_keeps_a_token_of_its_own() -> None:
    ids, lengths, groups = _rows([[5, 6, 7]], [[[8, 9], []]])
    pk = pack_groups(ids, lengths, groups, ratio=0.0)
    assert pk is not None and pk.input_ids.tolist() == [[5, 6, 7, 8, 9, 7]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4, 2]]


def test_packing_is_declined_without_a_shared_prefix_or_when_attention_would_dominate() -> None:
    ids, lengths, groups = _rows([[5], [6]], [[[7, 8]], [[9, 10]]])
    assert pack_groups(ids, lengths, groups, ratio=0.0) is None  # groups of one row each
    ids, lengths, groups = _rows([[5, 6, 7]], [[[8] * 40, [9] * 40]])
    assert pack_groups(ids, lengths, groups, ratio=0.0) is not None
    assert pack_groups(ids, lengths, groups, ratio=1.0) is None  # dense attention over 83 tokens costs more


@pytest.fixture(scope="module")
def model(fallback_model: Path) -> torch.nn.Module:
    return load_causal_lm(fallback_model, torch.float32)


def test_packed_logprobs_and_gradients_equal_the_unpacked_ones(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size

    def rand(n: int) -> list[int]:
        return torch.randint(5, V, (n,), generator=g).tolist()

    ids, lengths, groups = _rows([rand(12), rand(9)], [[rand(3), rand(5), rand(1)], [rand(4), rand(2)]])
    attn = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
    needed = torch.zeros_like(ids, dtype=torch.bool)
    for b, start in enumerate([12, 12, 12, 9, 9]):
        needed[b, start : int(lengths[b])] = True
    needed[0, 4] = True  # a token inside the shared prefix is read too
    pk = pack_groups(ids, lengths, groups, ratio=attention_cost_ratio(model))
    assert pk is not None and pk.packed_tokens < pk.unpacked_tokens
    out = {}
    for name, packed in (("unpacked", None), ("packed", pk)):
        model.zero_grad()
        logp, ent = sequence_logprobs(model, ids, attn, 0.7, needed=needed, packed=packed, return_entropy=True)
        (logp.sum() + 0.1 * ent.sum()).backward()
        out[name] = (logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()])
    (lu, eu, gu), (lp, ep, gp) = out["unpacked"], out["packed"]
    assert torch.equal(lu != 0, lp != 0) and int((lu != 0).sum()) == int(needed[:, 1:].sum())
    torch.testing.assert_close(lp, lu, rtol=0, atol=1e-5)
    torch.testing.assert_close(ep, eu, rtol=0, atol=1e-5)
    for a, b in zip(gp, gu, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_packed_rows_need_the_needed_mask(model: torch.nn.Module) -> None:
    ids, lengths, groups = _rows([[5, 6, 7]], [[[8, 9], [10, 11]]])
    pk = pack_groups(ids, lengths, groups, ratio=0.0)
    with pytest.raises(ValueError, match="packed rows need `needed`"):
        sequence_logprobs(model, ids, torch.ones_like(ids), packed=pk)


class _Wrapper(torch.nn.Module):
    """A model whose LM head the logprob code cannot see (as the LoRA reference view)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self._inner = [inner]

    def forward(self, **kwargs: object) -> object:
        return self._inner[0](**kwargs)


def test_a_model_whose_head_is_hidden_gets_the_same_packed_logprobs(model: torch.nn.Module) -> None:
    ids, lengths, groups = _rows([[5, 6, 7, 8]], [[[9, 10], [11, 12, 13]]])
    attn = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
    needed = attn.bool() & (torch.arange(ids.shape[1]) >= 4)
    pk = pack_groups(ids, lengths, groups, ratio=0.0)
    with torch.no_grad():
        direct = sequence_logprobs(model, ids, attn, needed=needed, packed=pk)
        wrapped = sequence_logprobs(_Wrapper(model), ids, attn, needed=needed, packed=pk)
        unpacked = sequence_logprobs(model, ids, attn, needed=needed)
    torch.testing.assert_close(wrapped, direct, rtol=0, atol=1e-6)
    torch.testing.assert_close(direct, unpacked, rtol=0, atol=1e-5)

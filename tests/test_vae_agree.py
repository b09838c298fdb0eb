"""The input fingerprint a distributed decode's ranks compare (xbackend/vae/agree.py), in one process: the
content digest sees every bit, the same on any layout, thread count and device; the mismatch message names
the ranks that differ and in what; `LOCAL` is one object everywhere. The ranks themselves:
test_vae_distributed.py and test_patch_decode_group.py."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from xbackend.vae import LOCAL, content_digest, require_same_on_ranks
from xbackend.vae.agree import mismatch_message


def _d(t: torch.Tensor) -> int:
    return int(content_digest(t))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8, torch.complex64]
)
def test_digest_sees_one_changed_element_and_a_swap(dtype: torch.dtype) -> None:
    t = (torch.arange(3 * 4 * 5, dtype=torch.float64).reshape(3, 4, 5) % 97).to(dtype)
    base = _d(t)
    assert _d(t.clone()) == base
    for index in [(0, 0, 0), (1, 2, 3), (2, 3, 4)]:
        changed = t.clone()
        changed[index] = changed[index] + 1
        assert _d(changed) != base, index
    swapped = t.clone()
    swapped[0, 0, 0], swapped[2, 3, 4] = t[2, 3, 4], t[0, 0, 0]
    assert _d(swapped) != base
    row_swap = t.clone()
    row_swap[0, 1], row_swap[0, 2] = t[0, 2], t[0, 1]  # whole rows: their sums trade places
    assert _d(row_swap) != base


def test_digest_reads_bits_not_values() -> None:
    zero = torch.zeros(4)
    negative = zero.clone()
    negative[2] = -0.0
    assert _d(zero) != _d(negative)
    nan = torch.tensor([1.0, float("nan"), 3.0])
    assert _d(nan) == _d(nan.clone())  # NaN != NaN, but its bits equal themselves
    assert _d(torch.tensor([True, False, True])) != _d(torch.tensor([True, True, False]))


def test_digest_is_the_same_for_any_layout_and_thread_count() -> None:
    t = torch.randn(6, 40, 33, generator=torch.Generator().manual_seed(0)).bfloat16()
    strided = t.transpose(0, 2).contiguous().transpose(0, 2)  # same values, other strides
    assert not strided.is_contiguous() and _d(strided) == _d(t)
    sliced = torch.randn(3, 8, 9)[:, 2:7, ::2]
    assert _d(sliced) == _d(sliced.contiguous())
    big = torch.randn(64, 1024, 257, generator=torch.Generator().manual_seed(1))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _d(big)
        torch.set_num_threads(max(2, before))
        assert _d(big) == one
    finally:
        torch.set_num_threads(before)


def test_digest_of_empty_and_scalar_tensors() -> None:
    assert _d(torch.empty(0, 3)) == 0
    assert _d(torch.tensor(1.0)) != _d(torch.tensor(2.0))


@pytest.mark.gpu
def test_digest_is_the_same_on_the_gpu() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.uint8):
        t = (torch.randn(2, 16, 48, 65, generator=torch.Generator().manual_seed(2)) * 50).to(dtype)
        on_gpu = t.cuda()
        assert content_digest(on_gpu).device.type == "cuda"
        assert _d(on_gpu) == _d(t), dtype
        assert _d(on_gpu[:, :, 3:40].transpose(1, 3)) == _d(t[:, :, 3:40].transpose(1, 3)), dtype


def _what(slot: int, differing: list[int], reference: list[int]) -> str:
    return f"slot {slot}"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([(1, 2), (1, 3)], "rank 1 differs from rank 0 in slot 1"),  # a tie: rank 0's side is the reference
        ([(1, 5), (1, 2), (1, 2)], "rank 0 differs from ranks 1, 2 in slot 1"),  # the majority is
        ([(1, 2), (1, 3), (1, 2), (7, 3)], "rank 1 differs from ranks 0, 2 in slot 1; rank 3 differs from ranks 0, 2 "
         "in slot 0 and slot 1"),
        ([(1, 2), (1, 3), (1, 3), (1, 2)], "ranks 1, 2 differ from ranks 0, 3 in slot 1"),
    ],
)
def test_mismatch_message_names_the_ranks_that_differ(rows, expected) -> None:
    message = mismatch_message(rows, _what, label="op 'x'", hint="Hint.")
    assert message == f"op 'x': the ranks of a distributed decode must be given the same inputs; {expected}. Hint."


def test_require_same_on_ranks_is_free_without_a_group() -> None:
    # No torch.distributed here: one rank, nothing to compare, no collective.
    require_same_on_ranks(None, {"z": torch.zeros(2)}, device=torch.device("cpu"), label="x", hint="")
    require_same_on_ranks(LOCAL, {"z": torch.zeros(2)}, device=torch.device("cpu"), label="x", hint="")
    with pytest.raises(TypeError, match="argument 'group' expected None, xbackend.vae.LOCAL or a torch.distributed"):
        require_same_on_ranks("world", {}, device=torch.device("cpu"), label="x", hint="")


def test_local_is_one_object() -> None:
    assert pickle.loads(pickle.dumps(LOCAL)) is LOCAL and copy.deepcopy(LOCAL) is LOCAL
    assert repr(LOCAL) == "xbackend.vae.LOCAL"


def test_noise_digest_folds_tensors_sequences_and_plain_values() -> None:
    from xbackend.vae.agree import NoiseDigest

    def digest(*draws) -> int:
        nd = NoiseDigest(torch.device("cpu"))
        for noise in draws:
            nd.add(noise)
        return int(nd.value)

    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert digest(a, b) == digest(a.clone(), b.clone())
    assert digest(a, b) != digest(b, a)  # draw order counts
    assert digest(a.reshape(3, 2)) != digest(a)  # so does the shape
    assert digest((1, 2, 3, 4, 5, 6, 7, 8) * 4) == digest((1, 2, 3, 4, 5, 6, 7, 8) * 4)  # long tuples of ints wrap
    assert digest([a, 3]) != digest([a, 4])
    assert digest(object()) == digest(object())  # no digest of an arbitrary object: its repr holds an address

"""T5's bucketed relative position bias (Raffel et al. 2020, §2.1): a learned scalar per head and per bucket
of key − query distance, added to the attention scores; one table shared by every layer of a stack.

Shapes: H heads, L query length, S key length. Positions are places on the key axis, as ``qkv.ALiBi``'s.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_positive_int
from .positional import query_places


def relative_position_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int = 32,
                             max_distance: int = 128) -> Tensor:
    """The bucket (an int64 tensor in [0, num_buckets)) of each relative position r = key − query.

    Bidirectional (encoders): half the buckets for r > 0, half for r ≤ 0, so n = num_buckets / 2 per side
    and d = |r|; one-sided (decoders): n = num_buckets and d = max(−r, 0) (the future all falls in bucket 0).
    With max_exact = n // 2:

        bucket(d) = d                                                             if d < max_exact
                  = min(n − 1, max_exact + ⌊ln(d / max_exact) / ln(max_distance / max_exact)
                                             · (n − max_exact)⌋)                   otherwise

    exact below max_exact, log-spaced up to max_distance, every farther distance in the last bucket;
    bidirectional adds n where r > 0. As Mesh TensorFlow's and Hugging Face's
    ``T5Attention._relative_position_bucket``.
    """
    if not isinstance(relative_position, Tensor) or relative_position.is_floating_point():
        got = relative_position.dtype if isinstance(relative_position, Tensor) else type(relative_position).__name__
        raise TypeError(f"relative_position must be an integer tensor, got {got}")
    check_bucket_sizes(num_buckets, max_distance, bidirectional)
    n = num_buckets // 2 if bidirectional else num_buckets
    if bidirectional:
        side = (relative_position > 0).long() * n  # keys after the query: the upper half
        distance = relative_position.abs()
    else:
        side, distance = 0, (-relative_position).clamp(min=0)
    max_exact = n // 2
    far = distance.clamp(min=max_exact).float() / max_exact  # ≥ 1: no log(0) in the branch not taken
    log_bucket = max_exact + (far.log() / math.log(max_distance / max_exact) * (n - max_exact)).long()
    return side + torch.where(distance < max_exact, distance, log_bucket.clamp(max=n - 1))


def check_bucket_sizes(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    """num_buckets leaves max_exact ≥ 1 per side and max_distance lies past it (else the log spacing is undefined)."""
    check_positive_int("num_buckets", num_buckets)
    check_positive_int("max_distance", max_distance)
    least = 4 if bidirectional else 2
    if num_buckets < least:
        raise ValueError(f"num_buckets must be >= {least} ({'bidirectional' if bidirectional else 'one-sided'}: "
                         f"at least one exact bucket per side), got {num_buckets}")
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance must be > max_exact = {max_exact} (num_buckets={num_buckets}, "
                         f"bidirectional={bidirectional}), got {max_distance}")


class T5RelativePositionBias(nn.Module):
    """T5's relative attention bias (Raffel et al. 2020 §2.1): bias[h, i, j] = E[bucket(j − i'), h].

    ``E`` is ``relative_attention_bias``, an ``nn.Embedding(num_buckets, num_heads)`` (Hugging Face's name);
    ``bidirectional``: True in encoders, False (one-sided) in decoders. One module serves every layer of a
    stack, as in T5 (its first layer's table). The bias is added to qkv's scaled scores (T5 itself does not
    divide by √D).
    """

    def __init__(self, num_heads: int, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        check_positive_int("num_heads", num_heads)
        if not isinstance(bidirectional, bool):
            raise TypeError(f"bidirectional must be a bool, got {bidirectional!r}")
        check_bucket_sizes(num_buckets, max_distance, bidirectional)
        self.num_heads, self.bidirectional = num_heads, bidirectional
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    def forward(self, q_len: int, k_len: int, *, positions: Tensor | None = None) -> Tensor:
        """Bias (1, H, L, S) for L queries over S keys (key j at place j).

        ``positions`` (L,): the queries' places i' on the key axis (a static KV cache passes its slots).
        None: bottom-right, i' = i + S − L (cached decoding: the new rows against every key).
        """
        device = self.relative_attention_bias.weight.device
        i = query_places(q_len, k_len, positions, device)[:, None]  # (L, 1)
        relative = torch.arange(k_len, device=device)[None, :] - i  # (L, S): j − i'
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (L, S, H) -> (1, H, L, S)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}")

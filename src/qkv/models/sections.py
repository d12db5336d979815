"""The component sections of ``ModelConfig`` besides attention and experts (``attention_config``, ``moe_config``):
position, feed-forward, normalisation, embedding and head, each a frozen dataclass validated on its own."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..nn.layers import NORMS, check_softcap, get_activation
from ..nn.positional import SINUSOIDAL_LAYOUTS
from ..nn.rope_scaling import RopeScaling, as_rope_scaling
from .attention_config import MAX_WIDTH, check_size

POSITIONAL = ("sinusoidal", "learned", "rope", "alibi", "t5", "none")
LAYER_TYPES = ("full_attention", "sliding_attention")  # what a block may be (Hugging Face's names); the factory
#                                                         (qkv.models.components) builds each


@dataclass(frozen=True)
class PositionConfig:
    """How order enters: added to the embeddings (sinusoidal, learned) or inside attention (rope, alibi, t5)."""

    kind: str = field(default="learned", metadata={  # sinusoidal | learned | rope | alibi | t5 (Raffel et al.'s
        "flag": "--positional",                       # bucketed bias) | none
        "help": "positional encoding: sinusoidal, learned, rope, alibi, t5 or none"})
    base: float = 10000.0  # RoPE's θ base, and the sinusoids' (the paper's 10000)
    interleaved: bool = False  # RoPE rotates pairs (x_2i, x_2i+1) (RoFormer, GPT-J); False: halves (LLaMA, NeoX)
    sinusoidal_layout: str = "interleaved"  # the paper's sin/cos per pair | split: sines, then cosines (Marian)
    rotary_dim: int | None = None  # RoPE rotates the first R dims of each head (GPT-NeoX, Pythia); None: all D
    local_base: float | None = None  # RoPE's base on sliding-window layers (Gemma 3's rope_local_base_freq); None: base
    scaling: RopeScaling | None = None  # RoPE scaling (linear, dynamic, yarn, llama3, longrope; a dict of its
    #                                     fields is taken); None: plain RoPE
    num_buckets: int = 32  # t5: relative-position buckets (Hugging Face's relative_attention_num_buckets)
    max_distance: int = 128  # t5: distances from here on share the last bucket (relative_attention_max_distance)
    nope_layers: tuple[int, ...] | None = None  # rope: these layers' attention has no position at all (SmolLM3's
    #                                             NoPE layers); None: every layer rotates

    def __post_init__(self) -> None:
        if self.kind not in POSITIONAL:
            raise ValueError(f"positional must be one of {POSITIONAL}, got {self.kind!r}")
        if not self.base > 1:
            raise ValueError(f"position.base must be > 1, got {self.base!r}")
        check_size("position.rotary_dim", self.rotary_dim, optional=True, limit=MAX_WIDTH)
        if self.rotary_dim is not None and (self.kind != "rope" or self.rotary_dim % 2):
            raise ValueError(f"position.rotary_dim must be an even number of dims with positional 'rope', got "
                             f"rotary_dim={self.rotary_dim} with positional {self.kind!r}")
        if self.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"sinusoidal_layout must be one of {SINUSOIDAL_LAYOUTS}, got {self.sinusoidal_layout!r}")
        if self.local_base is not None and (self.kind != "rope" or not self.local_base > 1):
            raise ValueError(f"position.local_base must be a RoPE base > 1 with positional 'rope', got "
                             f"local_base={self.local_base!r} with positional {self.kind!r}")
        try:  # a dict (config.json) -> RopeScaling
            object.__setattr__(self, "scaling", as_rope_scaling(self.scaling))
        except (TypeError, ValueError) as e:
            raise type(e)(f"position.scaling: {e}") from None
        if self.scaling is not None and self.kind != "rope":
            raise ValueError(f"position.scaling scales RoPE: it needs positional 'rope', got positional {self.kind!r}")
        self.check_buckets()
        if self.nope_layers is not None:
            object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
            if self.kind != "rope" or not all(isinstance(i, int) and not isinstance(i, bool) for i in self.nope_layers):
                raise ValueError(f"position.nope_layers must list layer indices (ints) with positional 'rope', got "
                                 f"{self.nope_layers!r} with positional {self.kind!r}")

    def check_buckets(self) -> None:
        """t5's buckets: positive ints, num_buckets >= 4 (an exact bucket per side, bidirectional) and
        max_distance > num_buckets // 2 (past the exact buckets, one-sided); set only with positional 't5'."""
        check_size("position.num_buckets", self.num_buckets, limit=MAX_WIDTH)
        check_size("position.max_distance", self.max_distance)
        if (self.num_buckets, self.max_distance) != (32, 128) and self.kind != "t5":
            raise ValueError(f"position.num_buckets and max_distance are T5's: they need positional 't5', got "
                             f"num_buckets={self.num_buckets}, max_distance={self.max_distance} with positional "
                             f"{self.kind!r}")
        if self.num_buckets < 4:
            raise ValueError(f"position.num_buckets must be >= 4 (one exact bucket per side), got {self.num_buckets}")
        if self.max_distance <= self.num_buckets // 2:
            raise ValueError(f"position.max_distance must be > num_buckets // 2 = {self.num_buckets // 2}, got "
                             f"{self.max_distance}")


@dataclass(frozen=True)
class FeedForwardConfig:
    """The position-wise feed-forward of every block."""

    d_ff: int | None = None  # F; None: 4 · d_model
    activation: str = "gelu"  # relu | gelu | gelu_tanh | silu | swiglu | geglu (qkv.nn.layers.ACTIVATIONS)
    bias: bool = True
    parallel: bool = False  # beside attention: x + Attn(Norm(x)) + FFN(Norm'(x)) (GPT-J, GPT-NeoX's Pythia)

    def __post_init__(self) -> None:
        check_size("d_ff", self.d_ff, optional=True)
        get_activation(self.activation)


@dataclass(frozen=True)
class NormConfig:
    """Normalisation: which, where (before each sublayer, or after the residual as in the paper), and a final one."""

    kind: str = "layernorm"  # layernorm | rmsnorm | rmsnorm_plus_one (Gemma's x/rms · (1 + w))
    eps: float = 1e-5
    first: bool = True  # pre-norm (GPT-2, LLaMA); False: the paper's post-norm
    final: bool = True  # a norm after the last block (pre-norm models have one; the paper, BERT, Marian none)
    sandwich: bool = False  # a norm after each sublayer too, before the residual add (Gemma 2/3's four norms)
    post_sublayer: bool = False  # with first=False: x + Norm(sublayer(x)), the norm before the add (OLMo-2)

    def __post_init__(self) -> None:
        if self.kind not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.kind!r}")
        if not self.eps > 0:
            raise ValueError(f"norm eps must be > 0, got {self.eps!r}")


@dataclass(frozen=True)
class EmbeddingConfig:
    """The token embedding and what is added to it before the first block."""

    scale: bool = False  # token embeddings × √d_model before PE is added (Vaswani et al. §3.4)
    scale_in_dtype: bool = False  # √d_model rounded to the weights' dtype first (Gemma's normalizer); False: exact
    init_std: float | None = None  # initial std; None: GPT-2's 0.02 (the paper's d^-0.5 keeps scaled embeddings,
    #                                × √d_model, at the amplitude of sinusoidal PE)
    type_vocab_size: int = 0  # > 0: BERT's token-type (segment) embeddings
    norm: bool = False  # BERT normalises the summed embeddings

    def __post_init__(self) -> None:
        if self.init_std is not None and (isinstance(self.init_std, bool) or
                                          not isinstance(self.init_std, (int, float)) or not self.init_std > 0):
            raise ValueError(f"embed_init_std must be a positive number or None, got {self.init_std!r}")
        if self.type_vocab_size:
            check_size("type_vocab_size", self.type_vocab_size)


@dataclass(frozen=True)
class HeadConfig:
    """The LM head, hidden state -> logits."""

    tie: bool = True  # shares the token embedding matrix (the encoder-decoder's: all three, as in the paper §3.4)
    bias: bool = False  # a bias on the logits (Marian's final_logits_bias)
    softcap: float | None = None  # logits ← cap·tanh(logits / cap) (Gemma 2's final_logit_softcapping)

    def __post_init__(self) -> None:
        check_softcap("head.softcap", self.softcap)

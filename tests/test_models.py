import pytest
import torch

import qkv
from qkv.nn.kv_cache import reorder_kv


def tiny(**kw):
    return qkv.ModelConfig.preset("tiny", **kw)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi", "none"])
def test_gpt_forward_shapes_loss_and_attentions(positional):
    model = qkv.GPT(tiny(position=dict(kind=positional)))
    ids = torch.randint(0, 64, (2, 10))
    targets = torch.randint(0, 64, (2, 10))
    out = model(ids, targets=targets, return_attention=True)
    assert out.logits.shape == (2, 10, 64)
    assert out.loss.item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.1)  # near uniform at init
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 10, 10)
    assert (out.attentions[0].triu(1) == 0).all()  # causal
    out.loss.backward()


def test_logits_to_keep_gives_the_last_positions_logits():
    """As Hugging Face's: the logits of the last N positions (what generate's prefill needs, N = 1); the
    hidden states stay whole; a negative N, or N with targets, is refused."""
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny")).eval()
    ids = torch.randint(0, 64, (2, 7))
    full = model(ids)
    for n in (1, 3, 7):
        out = model(ids, logits_to_keep=n)
        assert out.logits.shape == (2, n, 64)
        torch.testing.assert_close(out.logits, full.logits[:, -n:])
        torch.testing.assert_close(out.last_hidden_state, full.last_hidden_state)
    for bad in (dict(logits_to_keep=-1), dict(logits_to_keep=1, targets=ids)):
        with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0, and 0 with targets"):
            model(ids, **bad)


def test_tied_embeddings():
    model = qkv.GPT(tiny())
    assert model.lm_head.weight is model.embed.tok.weight
    assert qkv.GPT(tiny(head=dict(tie=False))).lm_head.weight is not None


def test_gpt_is_causal_future_tokens_do_not_change_past_logits():
    model = qkv.GPT(tiny()).eval()
    ids = torch.randint(0, 64, (1, 8))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 64
    torch.testing.assert_close(model(ids).logits[:, :5], model(changed).logits[:, :5])


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_generate_cached_equals_uncached(positional):
    model = qkv.GPT(tiny(position=dict(kind=positional), max_len=16))
    ids = torch.randint(0, 64, (2, 5))
    for kw in ({"temperature": 0}, {"temperature": 1.0, "top_k": 10, "top_p": 0.9, "seed": 3}):
        cached = model.generate(ids, 30, use_cache=True, **kw)  # 35 > max_len: the sliding window kicks in
        uncached = model.generate(ids, 30, use_cache=False, **kw)
        assert cached.shape == (2, 35) and torch.equal(cached, uncached)


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "sinusoidal"])
def test_left_padded_batch_gives_each_prompt_its_own_tokens(positional):
    model = qkv.GPT(tiny(position=dict(kind=positional)))
    a, b = torch.randint(1, 64, (1, 6)), torch.randint(1, 64, (1, 3))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], dim=1)])
    mask = batch != 0
    mask[0] = True
    out = model.generate(batch, 8, temperature=0, mask=mask)
    assert torch.equal(out[0, 6:], model.generate(a, 8, temperature=0)[0, 6:])
    assert torch.equal(out[1, 6:], model.generate(b, 8, temperature=0)[0, 3:])


def test_generate_seed_eos_and_bad_arguments():
    model = qkv.GPT(tiny())
    ids = torch.randint(0, 64, (1, 4))
    assert torch.equal(model.generate(ids, 10, seed=1), model.generate(ids, 10, seed=1))
    greedy = model.generate(ids, 10, temperature=0)
    eos = int(greedy[0, 4])
    assert model.generate(ids, 10, temperature=0, eos_id=eos).shape == (1, 5)
    for kw, words in (({"temperature": -1}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 1.5}, "top_p")):
        with pytest.raises(ValueError, match=words):
            model.generate(ids, 3, **kw)
    with pytest.raises(ValueError, match="ids"):
        model.generate(torch.randn(1, 3), 3)


def test_top_k_and_top_p_filters():
    from qkv.generation import top_k_filter, top_p_filter

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(top_p_filter(logits, 0.75)).tolist() == [[False, False, True, True]]
    assert torch.isinf(top_p_filter(logits, 0.1)).tolist() == [[False, True, True, True]]


def test_token_ids_out_of_range_and_learned_positions_past_max_len():
    model = qkv.GPT(tiny(max_len=8))
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        model(torch.tensor([[1, 64]]))
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_encoder_padding_does_not_change_real_tokens():
    model = qkv.Encoder(tiny(position=dict(kind="learned"), normalization=dict(first=False, final=False),
                             embedding=dict(type_vocab_size=2, norm=True))).eval()
    ids = torch.randint(0, 64, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    out = model(padded, mask=mask, return_attention=True)
    torch.testing.assert_close(out.last_hidden_state[:, :5], model(ids).last_hidden_state, atol=1e-5, rtol=0)
    assert (out.attentions[0][..., 5:] == 0).all()


def test_encoder_decoder_transformer():
    model = qkv.Transformer(tiny(position=dict(kind="sinusoidal"), feed_forward=dict(activation="relu"),
                                 normalization=dict(first=False, final=False)))
    src, tgt = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
    out = model(src, tgt, targets=tgt, return_attention=True)
    assert out.logits.shape == (2, 5, 64) and out.loss.item() > 0
    assert out.cross_attentions[0].shape == (2, 4, 5, 7)
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    out = model(src, tgt, src_mask=src_mask, return_attention=True)
    assert (out.cross_attentions[0][1, ..., 4:] == 0).all()


@pytest.mark.parametrize(
    "kw,error,words",
    [({"d_model": 30, "attention": {"num_heads": 4}}, ValueError, "divisible"),
     ({"position": {"kind": "xpos"}}, ValueError, "positional"),
     ({"attention": {"num_kv_heads": 3}}, ValueError, "multiple"), ({"d_model": 10**9}, ValueError, "absurd"),
     ({"vocab_size": 0}, ValueError, "vocab_size"), ({"normalization": {"kind": "batchnorm"}}, ValueError, "norm")],
)
def test_config_validation(kw, error, words):
    with pytest.raises(error, match=words):
        tiny(**kw)


def test_config_round_trip_and_unknown_keys():
    c = tiny(position=dict(kind="rope"))
    assert qkv.ModelConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown"):
        qkv.ModelConfig.from_dict({**c.to_dict(), "n_embd": 3})
    with pytest.raises(TypeError, match="bool"):
        qkv.ModelConfig.from_dict({**c.to_dict(), "norm_first": "yes"})
    with pytest.raises(ValueError, match="preset"):
        qkv.ModelConfig.preset("huge")


# --- one trunk: weight names, parameter counts, loss, initialisation ---------------------

ATTN = [f"{proj}.{p}" for proj in ("q_proj", "k_proj", "v_proj", "out_proj") for p in ("weight", "bias")]
NORM = ["weight", "bias"]
FF = [f"{proj}.{p}" for proj in ("up_proj", "down_proj") for p in ("weight", "bias")]


def block_names(i, cross=False):
    names = [f"attn.{n}" for n in ATTN] + [f"attn_norm.{n}" for n in NORM]
    if cross:
        names += [f"cross_attn.{n}" for n in ATTN] + [f"cross_norm.{n}" for n in NORM]
    return [f"blocks.{i}.{n}" for n in names + [f"ff.{n}" for n in FF] + [f"ff_norm.{n}" for n in NORM]]


TRUNK = ["embed.tok.weight", "embed.pos.weight", *block_names(0), "final_norm.weight", "final_norm.bias"]
DECODER = ["embed.tok.weight", "embed.pos.weight", *block_names(0, cross=True), *block_names(1, cross=True),
           "final_norm.weight", "final_norm.bias", "lm_head.weight"]


def test_weight_names_are_the_checkpoint_names():
    """Pinned from the models before the shared trunk (run directories and interop/hf.py rely on them)."""
    c = tiny(num_layers=1)
    assert list(qkv.GPT(c).state_dict()) == TRUNK + ["lm_head.weight"]
    assert list(qkv.Encoder(c).state_dict()) == TRUNK
    names = qkv.Transformer(tiny(num_layers=1, num_decoder_layers=2)).state_dict()
    assert sorted(names) == sorted([f"encoder.{n}" for n in TRUNK] + DECODER)


def test_num_parameters_of_every_model():
    # tiny: V=64, C=32, max_len=64, 2 layers, d_ff=128. A block: attention 4(C²+C) = 4224, two norms 128,
    # feed-forward (C·4C + 4C) + (4C·C + C) = 8352: 12704; cross-attention adds 4224 + 64.
    # Token and position tables 64·32 each; final norm 64; tied heads and tables count once.
    trunk = 2 * 12704 + 2 * 2048 + 64
    assert qkv.GPT(tiny()).num_parameters() == trunk == qkv.Encoder(tiny()).num_parameters()
    assert qkv.Transformer(tiny()).num_parameters() == trunk + 2 * (12704 + 4288) + 2048 + 64
    assert qkv.GPT(tiny(head=dict(tie=False))).num_parameters() == trunk + 2048


def test_every_model_checks_targets_and_label_smoothing_is_the_textbook_mixture():
    torch.manual_seed(0)
    gpt, model = qkv.GPT(tiny()), qkv.Transformer(tiny())
    src, tgt = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
    for run in (lambda t: gpt(tgt, targets=t), lambda t: model(src, tgt, targets=t)):
        with pytest.raises(ValueError, match=r"targets must be an integer tensor with the shape of ids \(2, 5\)"):
            run(tgt[:, :4])
        with pytest.raises(ValueError, match="integer"):
            run(tgt.float())
    targets = tgt.clone()
    targets[1, 3:] = -100  # ignored
    eps = 0.1
    out = model(src, tgt, targets=targets, label_smoothing=eps)
    logp = out.logits.float().log_softmax(-1)[targets != -100]  # (N, V)
    nll = -logp.gather(-1, targets[targets != -100][:, None]).squeeze(-1)
    want = ((1 - eps) * nll - eps * logp.mean(-1)).mean()
    torch.testing.assert_close(out.loss, want)
    torch.testing.assert_close(model(src, tgt, targets=targets).loss, nll.mean())
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\), got 1.0"):
        model(src, tgt, targets=targets, label_smoothing=1.0)


def test_each_stack_is_initialised_by_its_own_depth():
    torch.manual_seed(0)
    model = qkv.Transformer(tiny(num_layers=1, num_decoder_layers=8))

    def residual_std(blocks):  # residual projections: N(0, 0.02 / √(2·layers))
        return torch.cat([p.flatten() for n, p in blocks.named_parameters()
                          if n.endswith(("out_proj.weight", "down_proj.weight"))]).std().item()

    assert residual_std(model.encoder.blocks) == pytest.approx(0.02 / 2 ** 0.5, rel=0.1)  # 1 encoder layer
    assert residual_std(model.blocks) == pytest.approx(0.02 / 4, rel=0.1)  # 8 decoder layers
    assert model.blocks[0].attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)


# --- the encoder-decoder: encode, decode, cached steps --------------------------------

def translation_batch(B=2, S=7, T=6):
    """Sources right-padded (row 1 has 4 real tokens), targets of length T."""
    src, tgt = torch.randint(1, 64, (B, S)), torch.randint(1, 64, (B, T))
    src_mask = torch.ones(B, S, dtype=torch.bool)
    src_mask[1, 4:] = False
    return src, src_mask, tgt


def test_forward_is_encode_then_decode_and_source_padding_changes_nothing():
    torch.manual_seed(0)
    model = qkv.Transformer(tiny(position=dict(kind="sinusoidal"), normalization=dict(first=False, final=False))).eval()
    src, src_mask, tgt = translation_batch()
    out = model(src, tgt, src_mask=src_mask, return_attention=True)
    memory = model.encode(src, src_mask=src_mask)
    assert memory.shape == (2, 7, 32)
    dec = model.decode(tgt, memory, src_mask=src_mask, return_attention=True)
    assert torch.equal(out.logits, dec.logits)
    assert len(out.attentions) == len(out.cross_attentions) == 2
    assert all(map(torch.equal, out.attentions + out.cross_attentions, dec.attentions + dec.cross_attentions))
    alone = model(src[1:, :4], tgt[1:]).logits  # row 1 without its padding
    torch.testing.assert_close(out.logits[1:], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi"])
@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_cached_step_by_step_decoding_equals_full_decode(positional, static):
    torch.manual_seed(0)
    model = qkv.Transformer(tiny(attention=dict(num_kv_heads=2), position=dict(kind=positional), num_decoder_layers=3)).eval()
    src, src_mask, tgt = translation_batch()
    memory = model.encode(src, src_mask=src_mask)
    full = model.decode(tgt, memory, src_mask=src_mask).logits  # (B, T, V), no cache
    cross_kv, caches = model.cross_kv(memory), model.new_kv_caches(2, 8 if static else 6)
    kw = dict(src_mask=src_mask, kv_caches=caches, cross_kv=cross_kv)
    if static:  # slots 6, 7 stay empty and masked
        slots, steps = torch.zeros(2, 8, dtype=torch.bool), []
        for t in range(6):
            slots[:, t] = True
            steps.append(model.decode(tgt[:, t:t + 1], None, tgt_mask=slots, input_pos=torch.tensor([t]), **kw).logits)
    else:  # a two-token prefill, then one token at a time
        steps = [model.decode(tgt[:, :2], None, **kw).logits]
        steps += [model.decode(tgt[:, t:t + 1], None, **kw).logits for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_cross_kv_is_projected_once_and_gives_the_same_logits():
    torch.manual_seed(0)
    model = qkv.Transformer(tiny(attention=dict(num_kv_heads=1))).eval()
    src, src_mask, tgt = translation_batch()
    memory = model.encode(src, src_mask=src_mask)
    cross_kv = model.cross_kv(memory)
    assert len(cross_kv) == 2 and cross_kv[0][0].shape == (2, 1, 7, 8)  # per layer (B, G, S, D)
    calls = []
    hook = model.blocks[0].cross_attn.k_proj.register_forward_hook(lambda *a: calls.append(1))
    reused = [model.decode(tgt[:, :t], None, src_mask=src_mask, cross_kv=cross_kv).logits for t in (2, 4, 6)]
    assert calls == []  # no projection of the source per step
    recomputed = model.decode(tgt, memory, src_mask=src_mask).logits
    hook.remove()
    assert len(calls) == 1
    assert torch.equal(reused[-1], recomputed)


def test_reordered_caches_continue_the_chosen_rows():
    """Beam search's move: after reorder, row b goes on from old row idx[b]'s prefix and source."""
    torch.manual_seed(0)
    model = qkv.Transformer(tiny(attention=dict(num_kv_heads=2), position=dict(kind="rope"))).eval()
    src, src_mask, tgt = translation_batch(B=3, T=4)
    memory = model.encode(src, src_mask=src_mask)
    cross_kv, caches = model.cross_kv(memory), model.new_kv_caches(3, 4)
    model.decode(tgt[:, :3], None, src_mask=src_mask, kv_caches=caches, cross_kv=cross_kv)
    idx = torch.tensor([2, 0, 0])
    for cache in caches:
        cache.reorder(idx)
    cross_kv = reorder_kv(cross_kv, idx)
    got = model.decode(tgt[:, 3:], None, src_mask=src_mask[idx], kv_caches=caches, cross_kv=cross_kv).logits
    prefix = torch.cat([tgt[idx, :3], tgt[:, 3:]], dim=1)  # chosen rows' prefixes + this step's tokens
    want = model(src[idx], prefix, src_mask=src_mask[idx]).logits[:, -1:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_encoder_decoder_bad_input():
    model = qkv.Transformer(tiny())
    src, src_mask, tgt = translation_batch()
    memory = model.encode(src, src_mask=src_mask)
    with pytest.raises(ValueError, match="memory .* or its cross_kv"):
        model.decode(tgt, None)
    with pytest.raises(ValueError, match="expected 2 cross_kv pairs .* got 1"):
        model.decode(tgt, memory, cross_kv=model.cross_kv(memory)[:1])
    with pytest.raises(ValueError, match="expected 2 kv_caches .* got 3"):
        model.decode(tgt, memory, kv_caches=qkv.GPT(tiny(num_layers=3)).new_kv_caches(2, 6))
    with pytest.raises(ValueError, match=r"tgt_ids must be an integer tensor \(B, T\), got torch.float32"):
        model.decode(tgt.float(), memory)
    with pytest.raises(ValueError, match="src_ids must be"):
        model.encode(src[0])
    with pytest.raises(ValueError, match=r"mask must be bool \(B=2, S=7\)"):
        model.decode(tgt, memory, src_mask=src_mask[:, :5])


def test_embed_init_std_sets_the_token_embeddings_scale_only():
    from qkv import ModelConfig, Transformer

    base = dict(vocab_size=500, d_model=64, attention=dict(num_heads=4), position=dict(kind="sinusoidal"),
                num_layers=1)
    default = Transformer(ModelConfig(**base))
    paper = Transformer(ModelConfig(**base, embedding=dict(init_std=64 ** -0.5)))
    assert abs(float(default.encoder.embed.tok.weight.std()) - 0.02) < 0.002
    assert abs(float(paper.encoder.embed.tok.weight.std()) - 0.125) < 0.01
    assert paper.embed.tok.weight is paper.encoder.embed.tok.weight  # still one shared matrix
    assert abs(float(paper.blocks[0].attn.q_proj.weight.std()) - 0.02) < 0.003  # the rest keeps GPT-2's init
    for bad in (0, -1.0, "0.1", True):
        with pytest.raises(ValueError, match="embed_init_std"):
            ModelConfig(**base, embedding=dict(init_std=bad))

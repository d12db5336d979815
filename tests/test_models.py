import pytest
import torch

import qkv


def tiny(**kw):
    return qkv.ModelConfig.preset("tiny", **kw)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi", "none"])
def test_gpt_forward_shapes_loss_and_attentions(positional):
    model = qkv.GPT(tiny(positional=positional))
    ids = torch.randint(0, 64, (2, 10))
    targets = torch.randint(0, 64, (2, 10))
    out = model(ids, targets=targets, return_attention=True)
    assert out.logits.shape == (2, 10, 64)
    assert out.loss.item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.1)  # near uniform at init
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 4, 10, 10)
    assert (out.attentions[0].triu(1) == 0).all()  # causal
    out.loss.backward()


def test_tied_embeddings():
    model = qkv.GPT(tiny())
    assert model.lm_head.weight is model.embed.tok.weight
    assert qkv.GPT(tiny(tie_embeddings=False)).lm_head.weight is not None


def test_gpt_is_causal_future_tokens_do_not_change_past_logits():
    model = qkv.GPT(tiny()).eval()
    ids = torch.randint(0, 64, (1, 8))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 64
    torch.testing.assert_close(model(ids).logits[:, :5], model(changed).logits[:, :5])


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi"])
def test_generate_cached_equals_uncached(positional):
    model = qkv.GPT(tiny(positional=positional, max_len=16))
    ids = torch.randint(0, 64, (2, 5))
    for kw in ({"temperature": 0}, {"temperature": 1.0, "top_k": 10, "top_p": 0.9, "seed": 3}):
        cached = model.generate(ids, 30, use_cache=True, **kw)  # 35 > max_len: the sliding window kicks in
        uncached = model.generate(ids, 30, use_cache=False, **kw)
        assert cached.shape == (2, 35) and torch.equal(cached, uncached)


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "sinusoidal"])
def test_left_padded_batch_gives_each_prompt_its_own_tokens(positional):
    model = qkv.GPT(tiny(positional=positional))
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
    from qkv.generate import top_k_filter, top_p_filter

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
    model = qkv.Encoder(tiny(positional="learned", type_vocab_size=2, embedding_norm=True, norm_first=False)).eval()
    ids = torch.randint(0, 64, (1, 5))
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3])
    out = model(padded, mask=mask, return_attention=True)
    torch.testing.assert_close(out.last_hidden_state[:, :5], model(ids).last_hidden_state, atol=1e-5, rtol=0)
    assert (out.attentions[0][..., 5:] == 0).all()


def test_encoder_decoder_transformer():
    model = qkv.Transformer(tiny(positional="sinusoidal", norm_first=False, activation="relu"))
    src, tgt = torch.randint(0, 64, (2, 7)), torch.randint(0, 64, (2, 5))
    out = model(src, tgt, targets=tgt, return_attention=True)
    assert out.logits.shape == (2, 5, 64) and out.loss.item() > 0
    assert out.cross_attentions[0].shape == (2, 4, 5, 7)
    src_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    out = model(src, tgt, src_mask=src_mask, return_attention=True)
    assert (out.cross_attentions[0][1, ..., 4:] == 0).all()


@pytest.mark.parametrize(
    "kw,error,words",
    [({"d_model": 30, "num_heads": 4}, ValueError, "divisible"), ({"positional": "xpos"}, ValueError, "positional"),
     ({"num_kv_heads": 3}, ValueError, "multiple"), ({"d_model": 10**9}, ValueError, "absurd"),
     ({"vocab_size": 0}, ValueError, "vocab_size"), ({"norm": "batchnorm"}, ValueError, "norm")],
)
def test_config_validation(kw, error, words):
    with pytest.raises(error, match=words):
        tiny(**kw)


def test_config_round_trip_and_unknown_keys():
    c = tiny(positional="rope")
    assert qkv.ModelConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="unknown"):
        qkv.ModelConfig.from_dict({**c.to_dict(), "n_embd": 3})
    with pytest.raises(TypeError, match="bool"):
        qkv.ModelConfig.from_dict({**c.to_dict(), "norm_first": "yes"})
    with pytest.raises(ValueError, match="preset"):
        qkv.ModelConfig.preset("huge")

"""Streaming: generate(streamer=) hands on each token as it is chosen, without changing a single one, and
TextStreamer writes only text that is complete (a character split over byte-level tokens waits for its last
byte), the pieces adding up to the decoded sequence."""
import pytest
import torch

import qkv
from qkv.data import BPETokenizer, CharTokenizer
from qkv.generation import TextStreamer, generate, generate_text

ZH = "狗咬人，人咬狗。今天天气很好，我们去公园散步。注意力机制与位置编码。" * 3


class Recorder:
    """A streamer that keeps what it was handed."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, ids):
        self.puts.append(ids.clone())

    def end(self):
        self.ended += 1


def tiny_gpt(vocab: int, max_len: int = 16, positional: str = "learned") -> qkv.GPT:
    torch.manual_seed(0)
    return qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=vocab, max_len=max_len, position=dict(kind=positional))).eval()


def fed_token_by_token(tokenizer, text: str, **kwargs) -> list[str]:
    """The pieces a TextStreamer writes for ``text``'s tokens, handed over one at a time after an empty prompt."""
    pieces = []
    streamer = TextStreamer(tokenizer, write=pieces.append, **kwargs)
    streamer.put([])
    for i in tokenizer.encode(text):
        streamer.put(torch.tensor([[i]]))
    streamer.end()
    return pieces


@pytest.mark.parametrize("window", [64, 6])  # 6: the window is restarted many times
def test_byte_level_pieces_of_chinese_print_only_whole_characters(window):
    tok = BPETokenizer.train(ZH, vocab_size=270)  # few merges: most characters are 2 or 3 byte tokens
    ids = tok.encode(ZH)
    assert len(ids) > len(ZH)  # characters really are split across tokens
    pieces = fed_token_by_token(tok, ZH, window=window, context=2)
    assert "".join(pieces) == ZH
    assert not any("\ufffd" in p for p in pieces)  # never the first bytes of a character
    assert len(pieces) > len(ZH) // 3  # written as it came, not at the end


def test_char_and_hugging_face_tokenizers_stream_their_decoded_text(with_tokenizer):
    from qkv.interop.hf import load_pretrained

    _, hf = load_pretrained(with_tokenizer)
    for tok, text in ((CharTokenizer("abcdef xyz"), "abc fed xyz" * 10), (hf, "héllo wörld the dog bites")):
        pieces = fed_token_by_token(tok, text, window=5, context=2)
        assert "".join(pieces) == tok.decode(tok.encode(text)) and len(pieces) > 3


def test_skip_prompt_and_a_batch():
    tok = CharTokenizer("abc")
    pieces = []
    streamer = TextStreamer(tok, write=pieces.append, skip_prompt=True)
    streamer.put(torch.tensor([[0, 1]]))
    streamer.put(torch.tensor([[2]]))
    streamer.end()
    assert pieces == ["c"] and streamer.text == "c"
    with pytest.raises(ValueError, match="one sequence; generate was given a batch of 2 rows"):
        TextStreamer(tok).put(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="0 < context < window"):
        TextStreamer(tok, window=4, context=4)


@pytest.mark.parametrize("backend, use_cache", [("eager", False), ("eager", True), ("auto", True)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streaming_changes_no_token(backend, use_cache, temperature):
    """The same tokens with and without a streamer, past max_len too (the window slides); the streamer
    gets the prompt, then every new token, once each, then end()."""
    model, ids = tiny_gpt(20), torch.tensor([[1, 2, 3]])
    kwargs = dict(temperature=temperature, seed=3, backend=backend, use_cache=use_cache)
    want = generate(model, ids, 40, **kwargs)
    rec = Recorder()
    got = generate(model, ids, 40, streamer=rec, **kwargs)
    assert torch.equal(got, want)
    assert torch.equal(rec.puts[0], ids) and torch.equal(torch.cat(rec.puts, dim=1), got) and rec.ended == 1


@pytest.mark.usefixtures("kernels")
def test_the_fused_step_streams_the_same_greedy_tokens():
    """The fused step's greedy calls take several tokens at once; with a streamer, bursts of a few, the same."""
    model, ids = tiny_gpt(20, max_len=64, positional="rope"), torch.tensor([[1, 2, 3]])
    want = generate(model, ids, 50, temperature=0, backend="eager")
    rec = Recorder()
    got = generate(model, ids, 50, temperature=0, compile="fused", streamer=rec)
    assert torch.equal(got, want) and torch.equal(torch.cat(rec.puts, dim=1), got)
    assert len(rec.puts) > 5  # handed on in bursts, not in one piece


def test_generate_text_streams_what_it_returns():
    tok = CharTokenizer("abcdefgh ")
    model, pieces = tiny_gpt(tok.vocab_size), []
    text = generate_text(model, tok, "abc", 30, seed=1, streamer=TextStreamer(tok, write=pieces.append))
    assert "".join(pieces) == text and pieces[0] == "abc" and len(pieces) == 31

"""The server's scheduler over a paged KV cache (qkv.serve.scheduler): greedy answers as one at a time through
rows joining and leaving, preemption, shared prefixes and chunked prefill; the queue; memory by budget."""
import os
import threading
import time

import pytest
import torch

import qkv
from qkv.generation import generate
from qkv.serve.scheduler import QueueFull, Request, Scheduler, Settings


def tiny_gpt(vocab_size: int, max_len: int = 96, **change) -> qkv.GPT:
    """A random GPT whose weights are scaled up: its greedy answers vary (a freshly initialised one repeats)."""
    torch.manual_seed(0)
    model = qkv.GPT(qkv.ModelConfig.preset("tiny", vocab_size=vocab_size, max_len=max_len,
                                           attention=dict(num_kv_heads=2), position=dict(kind="rope")).replace(**change)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(12)
    return model


def alone(model, prompts, lengths) -> list[list[int]]:
    """Each prompt's greedy answer from ``generate``, one at a time."""
    return [generate(model, torch.tensor([p]), n, temperature=0, backend="eager")[0, len(p):].tolist()
            for p, n in zip(prompts, lengths)]


def greedy(prompt: list[int], n: int, done: threading.Semaphore | None = None) -> Request:
    return Request(prompt, Settings(max_tokens=n, temperature=0), str,
                   lambda t, f: f and done is not None and done.release())


def assert_batched_as_alone(model, vocab: int = 64, prompts=None, lengths=(20, 7, 13, 4, 25, 9, 16),
                            **scheduler) -> Scheduler:
    """Prompts of different lengths and answers of different lengths, submitted at different steps through 3 rows:
    each answer is generate's, token for token. Returns the stopped scheduler (its stats)."""
    prompts = prompts or [torch.randint(0, vocab, (n,)).tolist() for n in (3, 11, 5, 17, 1, 8, 2)]
    want = alone(model, prompts, lengths)
    s = Scheduler(model, **{"max_batch": 3, "max_queue": 8, "backend": "eager", **scheduler}).start()
    done = threading.Semaphore(0)
    jobs = [greedy(p, n, done) for p, n in zip(prompts, lengths)]
    for job in jobs:
        s.submit(job)
        time.sleep(0.002)
    for _ in jobs:
        assert done.acquire(timeout=60)
    s.stop()
    assert [j.tokens for j in jobs] == want
    assert {j.finish_reason for j in jobs} == {"length"} and s.active == 0 and s.blocks.used == 0
    return s


def test_preempted_rows_are_recomputed_and_answer_as_alone():
    """A budget of 7 blocks of 16 tokens (one sequence of 96 needs 6): rows run out of blocks, the newest are
    preempted and recomputed, and every answer is still generate's."""
    model = tiny_gpt(64)
    from qkv.generation.paged import token_bytes
    s = assert_batched_as_alone(model, lengths=(40, 30, 45, 20, 50, 35, 60),
                                kv_cache_memory=7 * 16 * token_bytes(model))
    assert s.blocks.num_blocks == 7 and s.stats["preempted"] > 0


def test_a_shared_prefix_shares_its_blocks_and_answers_as_alone():
    """Prompts opening with one 40-token system prompt: its 2 full blocks of 16 are computed once, then held by
    several rows at once."""
    torch.manual_seed(1)
    system = torch.randint(0, 64, (40,)).tolist()
    prompts = [system + torch.randint(0, 64, (n,)).tolist() for n in (3, 9, 1, 14)]
    lengths = [12, 8, 15, 10]
    model = tiny_gpt(64)
    want = alone(model, prompts, lengths)
    s = Scheduler(model, max_batch=4, backend="eager")
    jobs = [greedy(p, n) for p, n in zip(prompts, lengths)]
    s.submit(jobs[0])
    s.step()  # the first prompt prefilled: its full blocks are cached
    for job in jobs[1:]:
        s.submit(job)
    s.step()
    held = [set(j.blocks) for j in jobs]
    common = held[0] & held[1] & held[2] & held[3]
    assert len(common) == 2 and all(s.blocks.refs[b] == 4 for b in common)
    while s.active:
        s.step()
    assert [j.tokens for j in jobs] == want and s.stats["shared_blocks"] == 6 and s.blocks.used == 0
    assert s.stats["folded"] == 3  # the rests after the shared blocks (17, 9, 22 tokens) rode in the decode forward


def test_a_long_prompt_is_prefilled_in_chunks_while_rows_keep_decoding():
    model = tiny_gpt(64)
    torch.manual_seed(2)
    short, long = torch.randint(0, 64, (5,)).tolist(), torch.randint(0, 64, (60,)).tolist()
    want = alone(model, [short, long], [30, 10])
    s = Scheduler(model, max_batch=2, backend="eager", max_prefill_tokens=8)
    first, second = greedy(short, 30), greedy(long, 10)
    s.submit(first)
    s.step()
    s.submit(second)
    before = len(first.tokens)
    for _ in range(7):  # 60 tokens in chunks of 8: 7 steps prefill 56
        s.step()
        assert second in s.prefilling
    assert len(first.tokens) == before + 7  # one token a step meanwhile
    while s.active:
        s.step()
    assert [first.tokens, second.tokens] == want and s.stats["prefill_chunks"] == 1 + 8


def one_prompt_twice(length: int, new: int):
    """(a scheduler prefilling 8 tokens a step in blocks of 4, two greedy requests for one random prompt of
    ``length`` tokens, its answer alone)."""
    model = tiny_gpt(64)
    prompt = torch.randint(0, 64, (length,)).tolist()
    s = Scheduler(model, max_batch=2, backend="eager", max_prefill_tokens=8, block_size=4)
    return s, greedy(prompt, new), greedy(prompt, new), alone(model, [prompt], [new])[0]


def test_a_prompt_joining_while_its_prefix_is_half_prefilled_shares_only_the_computed_blocks():
    """A 40-token prompt prefilled 8 tokens a step; the same prompt joins after its first chunk: it may share the
    blocks computed so far, not those still to come, and both answer as alone."""
    s, first, second, want = one_prompt_twice(40, 6)
    s.submit(first)
    s.step()
    s.submit(second)
    s.step()
    assert s.stats["shared_blocks"] == 2  # the 8 tokens prefilled by then
    while s.active:
        s.step()
    assert first.tokens == want and second.tokens == want


def test_prompts_admitted_together_share_the_prefix_the_first_one_prefilled():
    """Two 24-token prompts admitted in one step, prefilled 8 tokens a step: the second takes the 5 full blocks the
    first computed (its last token is recomputed) instead of prefilling them again; both answer as alone."""
    s, first, second, want = one_prompt_twice(24, 5)
    s.submit(first)
    s.submit(second)
    while s.active or len(s.waiting):
        s.step()
    assert first.tokens == want and second.tokens == want
    assert s.stats["shared_blocks"] == 5 and s.stats["prefill_chunks"] == 3 + 1 and s.blocks.used == 0


def test_mixed_prompts_under_chunked_prefill_answer_as_alone():
    assert_batched_as_alone(tiny_gpt(64), max_prefill_tokens=3, block_size=4)


def test_past_max_queue_the_scheduler_refuses():
    s = Scheduler(tiny_gpt(64), max_batch=1, max_queue=1, backend="eager")
    s.submit(greedy([1, 2], 3))
    s.submit(greedy([1, 2], 3))
    with pytest.raises(QueueFull, match="--max-batch 1, --max-queue 1"):
        s.submit(greedy([1, 2], 3))


def test_the_budget_sizes_the_cache_and_bad_values_are_refused():
    model = tiny_gpt(64)
    from qkv.generation.paged import token_bytes
    per_block = 16 * token_bytes(model)  # 16 tokens of 2 layers × k, v × 2 heads × 8 dims × 4 bytes
    assert token_bytes(model) == 2 * 2 * 2 * 8 * 4
    assert Scheduler(model, kv_cache_memory=10 * per_block + 5).blocks.num_blocks == 10
    assert Scheduler(model, max_batch=2, kv_cache_memory=10**9).blocks.num_blocks == 2 * 6  # capped by the need
    assert Scheduler(model, max_batch=2, max_model_len=40).blocks.num_blocks == 2 * 3  # the default, capped
    with pytest.raises(ValueError, match="holds 5 blocks of 16 tokens, fewer than one sequence of max_model_len=96"):
        Scheduler(model, kv_cache_memory=5 * per_block)
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(model, max_model_len=97)
    with pytest.raises(ValueError, match="a prompt must be 1 to 39 tokens"):
        Scheduler(model, max_model_len=40).submit(greedy([1] * 40, 1))


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory is read from Linux's /proc")
def test_a_131072_position_llama_shaped_model_starts_and_answers_in_little_memory():
    """Llama 3's context (131 072 positions, 8 query heads over 2 key/value heads, RoPE θ 500 000) at a tiny width:
    at the default 32 rows its cache would span 32 × 131 072 tokens; blocks are touched only as tokens come."""
    torch.manual_seed(0)
    config = qkv.ModelConfig(vocab_size=128, d_model=64, num_layers=2, max_len=131072, feed_forward=dict(d_ff=128),
                             position=dict(kind="rope", base=500000.0), normalization=dict(kind="rmsnorm"),
                             attention=dict(num_heads=8, num_kv_heads=2))
    model = qkv.GPT(config).eval()
    before = resident_bytes()
    s = Scheduler(model, backend="eager", kv_cache_memory=2 * 2**30)
    job = greedy([5, 6, 7], 8)
    s.submit(job)
    while s.active or s.waiting:
        s.step()
    assert s.blocks.num_blocks == 2 * 2**30 // (16 * 2 * 2 * 2 * 16 * 4)  # 2 GiB of blocks, most never touched
    assert len(job.tokens) == 8 and job.tokens == alone(model, [[5, 6, 7]], [8])[0]
    assert resident_bytes() - before < 200 * 2**20


def test_the_commands_memory_sizes(capsys):
    from qkv import cli
    from qkv.cli.serve import memory_size

    assert [memory_size(s) for s in ("2GiB", "512MB", "1.5g", "1000", "64kib")] == [
        2 * 2**30, 512 * 10**6, int(1.5e9), 1000, 64 * 2**10]
    args = cli.build_parser().parse_args(["serve", "--run", "r", "--kv-cache-memory", "2GiB", "--max-model-len", "64"])
    assert (args.kv_cache_memory, args.max_model_len, args.max_prefill_tokens) == (2 * 2**30, 64, 512)
    for bad in ("2 parsecs", "-1GB", "GB"):
        assert cli.main(["serve", "--run", "r", f"--kv-cache-memory={bad}"]) == 2
        err = capsys.readouterr().err
        assert "expected a size" in err and len(err.strip().splitlines()) == 1, err

"""`qkv serve`: an OpenAI-compatible HTTP server over the continuous-batching decoder.

    scheduler.py the scheduler: one thread owns the model and a paged KV cache; requests are admitted while
                 blocks remain, prefilled in chunks, preempted when blocks run out, and share prompt prefixes
    waiting.py   the waiting queue: submitted requests under the lock the scheduler's thread sleeps on
    batch.py     the running batch: admission, chunked prefill, the batched decode step, preemption
    request.py   a request as the scheduler sees it, its settings, and QueueFull (HTTP 429)
    text.py      a request's tokens as text: whole characters, held back while a stop string could begin
    protocol.py  OpenAI's requests, responses and error JSON, as typed models
    app.py       the FastAPI application: the endpoints, server-sent events, errors, the API key
    server.py    uvicorn around the application, in this thread or in a background one
"""

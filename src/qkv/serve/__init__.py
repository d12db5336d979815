"""`qkv serve`: an OpenAI-compatible HTTP server over the continuous-batching decoder.

    batcher.py   the scheduler: one thread owns the model, requests join and leave the batch at each step
    text.py      a request's tokens as text: whole characters, held back while a stop string could begin
    protocol.py  OpenAI's requests, responses and error JSON, as typed models
    app.py       the FastAPI application: the endpoints, server-sent events, errors, the API key
    server.py    uvicorn around the application, in this thread or in a background one
"""

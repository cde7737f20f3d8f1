"""The OpenAI-compatible HTTP API: request bodies in, the shared Generator, OpenAI JSON and
server-sent events out, served by uvicorn on the gateway's event loop."""

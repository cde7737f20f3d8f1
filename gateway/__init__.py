"""The gateway: the public face of a deployment.

It validates and tokenizes requests, admits them, routes each to an executor (exact prefix
overlap from the allocator against load), detokenizes the streamed tokens, applies stop
strings, and cancels an executor request whose client went away. One Generator serves both
APIs: gRPC (servicer.py, convert.py) and OpenAI-compatible HTTP (openai_http/). Its side of the
executors (directory, Session links, router) is executors/.
"""

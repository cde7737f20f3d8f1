"""Gateway: gRPC and OpenAI-compatible HTTP streaming, routing (a later issue)."""

"""The gRPC/ZMQ pipeline, sans I/O: tokenizers, chat-template rendering, detokenizing, stop
matching and the block builder that turns engine tokens into Anthropic stream events."""

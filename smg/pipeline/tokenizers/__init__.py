"""Model tokenizers for the gRPC pipeline: loading, encoding and decoding, and chat templates."""

from smg.pipeline.tokenizers.tokenizer import ChatTemplateError, Tokenizer

__all__ = ["ChatTemplateError", "Tokenizer"]

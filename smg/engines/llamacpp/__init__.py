"""A GGUF model behind the SGLang scheduler protocol, run in-process by llama.cpp (`xllamacpp`).

`gguf` reads a file's metadata, `tokenizer` exports the tokenizer directory the gateway loads with
`--model-path`, `sampling` maps an SGLang request onto llama.cpp's completion body, `generation`
follows one generation's chunks, and `server` serves the `SglangScheduler` service. `xllamacpp`
is the optional extra `smg-py[llamacpp]`; only `server` needs it.
"""

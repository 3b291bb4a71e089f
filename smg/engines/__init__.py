"""Inference engines that smg ships itself, served over one of the engine protocols the gateway
speaks (`smg engine …`). They import nothing of the gateway: the gateway reaches them over gRPC
like any other engine."""

"""Llama 3 pretraining: model, FLOPs, parallel layouts, the built-in training engine and the NeMo adapter."""

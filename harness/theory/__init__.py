"""Predictions, never measurements: model-state and activation memory (memory.py), bytes sent per step
(communication.py), all gathered under the summary's metric keys by predict.py. Nothing here builds a model
or imports torch; parameter counts are passed in."""

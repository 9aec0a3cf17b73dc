"""The origin: everything the edge cannot answer, generated and streamed.

config.py     the origin's EDGEQA_* settings
precision.py  the precision registry: each precision's linear, forward path and devices
model.py      loading the model (the embedded GGUF converted once into the cache)
lean_model.py  a Llama's weights read for the engine without transformers' model classes
chat.py       the chat template: prompts, and the tokens that end an answer
runtime.py    assembling the engine and the served releases (build_engine, load_runtime)
sampling.py   sampling parameters and the next token
detokenizer.py  token ids to text deltas, incrementally
engine/       continuous batching, speculative decoding, INT8 and GGUF weights (docs/engine.md)
server/       the OpenAI-compatible HTTP server (docs/origin.md)
"""

"""The origin: everything the edge cannot answer, generated and streamed.

config.py     the origin's EDGEQA_* settings
precision.py  the precision registry: each precision's linear, forward path and devices
model.py      which model a spec names, and loading it (model and tokenizer)
conversion.py  a GGUF file converted once into a folder in the cache (the gguf patch, locked)
model_folder.py  a model's folder as a value: the conversion marker, files kept beside it
lean_model.py  a Llama's weights read for the engine without transformers' model classes
chat.py       the chat template: prompts, and the tokens that end an answer
runtime.py    assembling the engine and the served releases (build_engine, load_runtime)
sampling.py   sampling parameters and the next token
detokenizer.py  token ids to text deltas, incrementally
engine/       continuous batching, speculative decoding, INT8 and GGUF weights (docs/engine.md)
server/       the OpenAI-compatible HTTP server (docs/origin.md)
"""

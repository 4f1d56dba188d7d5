"""Adapters that present other systems' decoders as specproof ``Engine`` subjects.

- ``hf_prompt_lookup``: transformers' own prompt-lookup decoding
  (``model.generate(prompt_lookup_num_tokens=...)``), a black-box engine
  (``steps=None``) certifiable with ``specproof certify engine --engine
  specproof.engine.adapters.hf_prompt_lookup:make``.

Each module imports its framework only when an engine is built.
"""

__all__: list[str] = []

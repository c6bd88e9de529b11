"""Llama-style decoders (zoo.models.llama); its spec is family.py."""

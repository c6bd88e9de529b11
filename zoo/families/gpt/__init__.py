"""GPT-2 style decoders (zoo.models.gpt); its spec is family.py."""

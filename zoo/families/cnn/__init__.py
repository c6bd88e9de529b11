"""The CNN image classifier (zoo.models.cnn); its spec is family.py."""

"""The model families, one folder each: `<family>/family.py` its `FamilySpec`, `<family>/keys.py`
the config keys only it reads (the schema composes them), its task, its Hugging Face
conversion and its planner description; `registry.py` maps `model.family` to the spec.
Nothing is imported here, so the schema can read a family's keys without building the registry."""

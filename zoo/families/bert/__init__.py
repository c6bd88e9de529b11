"""BERT: masked-LM pretraining (zoo.models.bert); its spec is family.py."""

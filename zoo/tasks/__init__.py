"""Model families as tasks the trainer runs (one file per family)."""
from zoo.tasks.bert import BertTask
from zoo.tasks.cnn import CNNTask
from zoo.tasks.gpt import GPTTask

TASKS = {"gpt": GPTTask, "bert": BertTask, "cnn": CNNTask}

"""The embedded demo target's text shape, apart from the code that builds it: the plan reads it at every parse
of the workflow, before the target exists, and importing the builder (Transformers' model classes) costs
seconds there."""

DEMO_HIDDEN_SIZE, DEMO_LAYERS = 256, 8
# what the plan knows of the demo target before the job that builds it has run
DEMO_SHAPE = {
    "hidden_size": DEMO_HIDDEN_SIZE,
    "num_hidden_layers": DEMO_LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": DEMO_HIDDEN_SIZE // 4,
    "intermediate_size": DEMO_HIDDEN_SIZE * 5 // 2,
    "vocab_size": 3072,
}

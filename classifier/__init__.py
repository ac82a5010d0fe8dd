"""The intent classifier: taxonomy, embedding backbone, MLP head, batched worker."""

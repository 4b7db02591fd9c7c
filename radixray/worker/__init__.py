"""The worker: a paged KV pool, a prefix cache, a scheduler and a model, driven by Engine."""

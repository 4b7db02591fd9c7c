"""The model side of a worker: a Llama-family decoder on the paged KV pool, its loaders (GGUF, HF
safetensors directory, random tiny config). Config and tokenizers live torch-free in
``radixray.model_meta`` and are re-exported here.

    model, config, tokenizer = load_model("smollm2")      # or "tiny", or a path
    attn, positions = AttentionMetadata.build(page_tables, num_cached, num_new, page_size)
    logits = model(input_ids, positions, attn, k_cache, v_cache, logits_indices)
"""

from radixray.model_meta import (
    CHATML,
    BPETokenizer,
    ByteTokenizer,
    ChatTemplate,
    ModelConfig,
    TokenizerProtocol,
    smollm2_gguf_path,
    tiny_config,
)

from .attention import AttentionMetadata
from .greedy import greedy_generate, new_kv_cache
from .llama import LlamaModel
from .loader import LoadedModel, load_model, random_hf_state_dict

__all__ = [
    "AttentionMetadata",
    "BPETokenizer",
    "ByteTokenizer",
    "CHATML",
    "ChatTemplate",
    "LlamaModel",
    "LoadedModel",
    "ModelConfig",
    "TokenizerProtocol",
    "greedy_generate",
    "load_model",
    "new_kv_cache",
    "random_hf_state_dict",
    "smollm2_gguf_path",
    "tiny_config",
]

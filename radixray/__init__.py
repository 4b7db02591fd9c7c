"""radixray: cache-aware LLM serving on Ray.

A global router keeps an approximate radix index of every worker's KV cache and sends each request
where the longest prompt prefix is already computed, while keeping load even.
"""

__version__ = "0.1.0"

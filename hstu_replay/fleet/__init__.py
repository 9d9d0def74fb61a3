"""A fleet of Triton servers, each with its own KV cache: which server a request goes to."""

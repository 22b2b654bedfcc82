"""Generating text fast (chapters 10, 11 and 14).

    decode       greedy and beam search for the encoder-decoder (sampling is tformer.sampling, the KV
                 cache tformer.cache)
    paged_cache  a paged KV cache (blocks of `block_size` tokens, block tables), vLLM's vocabulary; PagedStep,
                 the cache of one serving step (it attends over the blocks in place)
    engine       continuous batching over the paged cache: admission, preemption, prefix sharing; each
                 step is the model's own forward with a PagedStep as its cache
    quantize     int8 / int4 weights (QuantLinear, quantize_model)
    speculative  speculative decoding with a draft model
    rag          a TF-IDF retriever for retrieval-augmented generation
"""

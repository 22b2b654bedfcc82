"""Serving the course's models (chapter 14).

    runs    run folders: save_gpt_run / load_gpt_run (config.json, model.safetensors, tokenizer.json),
            a local GPT-2-format folder (load_hf), the offline demo model (demo_model)
    app     the OpenAI-compatible HTTP server over `tformer.inference.engine.Engine` (FastAPI + uvicorn)
    export  a run as a Hugging Face GPT-2 folder (`tformer export --to hf RUN DIR`)
    cli     `tformer serve` and `tformer export`
"""

"""Stand-in for SGLang's model loader package (srt/model_loader)."""

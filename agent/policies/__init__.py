"""Who proposes candidates: the offline tuner and the LLM."""

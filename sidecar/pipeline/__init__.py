"""Request building: from a stored branch to the request-only message list a provider gets.

Transformers and context management change only the request copy built here;
the stored branch is never rewritten.
"""

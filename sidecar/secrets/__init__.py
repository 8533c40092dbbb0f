"""Secrets: which names hold them, and how they are kept encrypted at rest.

- ``names``: the one rule for "this header / environment variable holds a secret";
- ``box``: SecretBox, AES-GCM sealing of stored secret values with the keys of ``keys``;
- ``keys``: where the key comes from (the host, the OS keychain, a key file).

Below the store in the layering: the store seals and opens values, the providers and
tools only ask ``names`` which values to mask.
"""

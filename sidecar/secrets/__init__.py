"""Secrets: which names hold them, and how they are kept encrypted at rest.

- ``names``: the one rule for "this header / environment variable holds a secret by its
  name" (what the providers scrub from their messages);
- ``urls``: which parts of a URL may hold a secret (its userinfo, its query values);
- ``mask``: what the wire shows of stored secrets (every value ``***``) and how a masked
  value sent back keeps the stored one;
- ``box``: SecretBox, AES-GCM sealing of stored secret values with the keys of ``keys``;
- ``aead``: AES-256-GCM of one value (pycryptodome, imported when a value is sealed or opened);
- ``keys``: where the key comes from (the host, the OS keychain, a key file);
- ``keychain``: which OS keychain, by rule (``PYTHON_KEYRING_BACKEND``, else the platform's);
- ``secret_service``: the Linux keychain, a freedesktop Secret Service client over jeepney.

Below the store in the layering: the store seals and opens values and masks its listings,
the tools mask the MCP listing, the providers ask ``names`` which values to scrub.
"""

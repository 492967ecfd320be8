"""Integrations that route frameworks' own GDN layers through gdn's ops.

Each integration is its own module, imported explicitly (`gdn.integrations.transformers`), so that
`import gdn` never imports a framework."""

"""Pure certificate logic: keys, the CA, issuing, records and rotation. No I/O here."""

//! Rewrites of a read command: `readConcern: {level: "available"}` and `maxTimeMS`, spliced
//! into the original bytes; message length and checksum fixed; compression redone.

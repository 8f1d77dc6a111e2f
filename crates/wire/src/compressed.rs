//! OP_COMPRESSED (2012): the wrapped message is decompressed for inspection only; the
//! original bytes are what gets forwarded unless a rewrite is the point.

use std::io::Read;

use bytes::{Buf, Bytes};

use super::{read_i32, OpCode, WireError};

pub const NOOP: u8 = 0;
pub const SNAPPY: u8 = 1;
pub const ZLIB: u8 = 2;
pub const ZSTD: u8 = 3;

/// The fixed part of an OP_COMPRESSED payload (the bytes after the header).
#[derive(Debug, Clone, Copy)]
pub struct Compressed<'a> {
    pub original_opcode: i32,
    pub uncompressed_size: i32,
    pub compressor: u8,
    pub data: &'a [u8],
}

impl<'a> Compressed<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Compressed<'a>, WireError> {
        if payload.len() < 9 {
            return Err(WireError::Truncated("op_compressed"));
        }
        let original_opcode = read_i32(payload, 0).ok_or(WireError::Truncated("op_compressed"))?;
        let uncompressed_size =
            read_i32(payload, 4).ok_or(WireError::Truncated("op_compressed"))?;
        if matches!(original_opcode, OpCode::COMPRESSED) {
            return Err(WireError::BadInnerOpcode(original_opcode));
        }
        let compressor = payload[8];
        if compressor > ZSTD {
            return Err(WireError::UnknownCompressor(compressor));
        }
        Ok(Compressed {
            original_opcode,
            uncompressed_size,
            compressor,
            data: &payload[9..],
        })
    }

    /// Decompresses the wrapped payload, refusing anything whose declared size exceeds `max`
    /// and anything that does not decompress to exactly the declared size.
    pub fn decompress(&self, max: usize) -> Result<Vec<u8>, WireError> {
        crate::counters::decompressed();
        let declared = self.uncompressed_size;
        if declared < 0 || declared as i64 > max as i64 {
            return Err(WireError::BadLength {
                len: declared as i64,
                max,
            });
        }
        let want = declared as usize;
        let out = match self.compressor {
            NOOP => self.data.to_vec(),
            SNAPPY => {
                let n = snappy_len(self.data)?;
                if n != want {
                    return Err(WireError::SizeMismatch {
                        declared: declared as i64,
                        actual: n,
                    });
                }
                snap::raw::Decoder::new()
                    .decompress_vec(self.data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?
            }
            ZLIB => read_bounded(
                flate2::read::ZlibDecoder::new(self.data),
                want,
                self.data.len(),
            )?,
            ZSTD => {
                let dec = zstd::stream::read::Decoder::with_buffer(self.data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?;
                read_bounded(dec, want, self.data.len())?
            }
            other => return Err(WireError::UnknownCompressor(other)),
        };
        if out.len() != want {
            return Err(WireError::SizeMismatch {
                declared: declared as i64,
                actual: out.len(),
            });
        }
        Ok(out)
    }
}

/// The most snappy can expand: a 3-byte copy tag yields at most 64 bytes (and the stream
/// starts with its length as a varint of up to 5 bytes).
pub const SNAPPY_MAX_RATIO: usize = 22;

/// The decompressed length a snappy block states, refused when its own format could not
/// produce it from this input (the decoder would allocate and zero it before failing).
fn snappy_len(data: &[u8]) -> Result<usize, WireError> {
    let n = snap::raw::decompress_len(data).map_err(|e| WireError::Decompress(e.to_string()))?;
    if n > data.len().saturating_mul(SNAPPY_MAX_RATIO) {
        return Err(WireError::Decompress(format!(
            "snappy block states {n} bytes from {} compressed: more than snappy can expand",
            data.len()
        )));
    }
    Ok(n)
}

/// A decompression of an OP_COMPRESSED's payload that can stop after a prefix and go on to
/// the whole later, from where it stopped: the bytes decompressed so far are kept, and so is
/// the decoder. Reading a command name costs a few hundred bytes of zlib or zstd, and
/// opening the whole message afterwards decompresses nothing twice. A snappy block is
/// decompressed whole at once (bounded by its declared size and snappy's own ratio).
pub struct Inflater {
    compressor: u8,
    declared: usize,
    out: Vec<u8>,
    decoder: Decoder,
}

enum Decoder {
    Zlib(flate2::bufread::ZlibDecoder<bytes::buf::Reader<Bytes>>),
    Zstd(zstd::stream::read::Decoder<'static, bytes::buf::Reader<Bytes>>),
    /// Nothing more to read (noop and snappy, decompressed at once; a stream read to its end).
    Done,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("compressor", &self.compressor)
            .field("declared", &self.declared)
            .field("decompressed", &self.out.len())
            .field("done", &matches!(self.decoder, Decoder::Done))
            .finish()
    }
}

impl Inflater {
    /// Begins decompressing `data` (the compressed bytes of an OP_COMPRESSED whose fixed part
    /// declared `declared` bytes and `compressor`) and decompresses its first `n` bytes (all
    /// of it for noop and snappy). `declared` above `max` is refused before anything is
    /// decompressed. Counted as one decompression (`counters`), however far it goes later.
    pub fn begin(
        compressor: u8,
        declared: i32,
        data: Bytes,
        n: usize,
        max: usize,
    ) -> Result<Inflater, WireError> {
        crate::counters::decompressed();
        if declared < 0 || declared as i64 > max as i64 {
            return Err(WireError::BadLength {
                len: declared as i64,
                max,
            });
        }
        let want = declared as usize;
        let compressed_len = data.len();
        let (out, decoder) = match compressor {
            NOOP => (data.to_vec(), Decoder::Done),
            SNAPPY => {
                let n = snappy_len(&data)?;
                if n != want {
                    return Err(WireError::SizeMismatch {
                        declared: declared as i64,
                        actual: n,
                    });
                }
                let out = snap::raw::Decoder::new()
                    .decompress_vec(&data)
                    .map_err(|e| WireError::Decompress(e.to_string()))?;
                (out, Decoder::Done)
            }
            ZLIB => (
                Vec::new(),
                Decoder::Zlib(flate2::bufread::ZlibDecoder::new(data.reader())),
            ),
            ZSTD => {
                let dec = zstd::stream::read::Decoder::with_buffer(data.reader())
                    .map_err(|e| WireError::Decompress(e.to_string()))?;
                (Vec::new(), Decoder::Zstd(dec))
            }
            other => return Err(WireError::UnknownCompressor(other)),
        };
        let mut inflater = Inflater {
            compressor,
            declared: want,
            out,
            decoder,
        };
        // The first allocation is sized from the compressed input, not from the peer's
        // declared size, so that a tiny message cannot make us allocate the maximum up front.
        inflater
            .out
            .reserve(n.min(want).min(compressed_len.saturating_mul(8) + 4096));
        inflater.read_to(n.min(want))?;
        Ok(inflater)
    }

    /// What has been decompressed so far (at least the `n` bytes asked of [`Inflater::begin`]
    /// unless the payload is shorter).
    pub fn prefix(&self) -> &[u8] {
        &self.out
    }

    pub fn compressor(&self) -> u8 {
        self.compressor
    }

    /// Goes on to the end and returns the whole payload, which must be exactly the declared
    /// size.
    pub fn finish(mut self) -> Result<Vec<u8>, WireError> {
        // One byte past the declared size tells a longer stream apart.
        self.read_to(self.declared + 1)?;
        if self.out.len() != self.declared {
            return Err(WireError::SizeMismatch {
                declared: self.declared as i64,
                actual: self.out.len(),
            });
        }
        Ok(self.out)
    }

    /// Decompresses until `out` holds `upto` bytes or the stream ends.
    fn read_to(&mut self, upto: usize) -> Result<(), WireError> {
        let more = upto.saturating_sub(self.out.len()) as u64;
        if more == 0 {
            return Ok(());
        }
        let read = match &mut self.decoder {
            Decoder::Zlib(d) => d.take(more).read_to_end(&mut self.out),
            Decoder::Zstd(d) => d.take(more).read_to_end(&mut self.out),
            Decoder::Done => return Ok(()),
        };
        let got = read.map_err(|e| WireError::Decompress(e.to_string()))?;
        if (got as u64) < more {
            self.decoder = Decoder::Done;
        }
        Ok(())
    }
}

/// Reads a decompressing stream to its end, at most `want + 1` bytes. The first allocation
/// is sized from the compressed input, not from the peer's declared size, so a tiny message
/// cannot make us allocate the maximum up front.
fn read_bounded(r: impl Read, want: usize, compressed_len: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(want.min(compressed_len.saturating_mul(8) + 4096));
    r.take(want as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| WireError::Decompress(e.to_string()))?;
    Ok(out)
}

/// Compresses `data` with the given compressor id (used when a rewrite must be re-wrapped).
pub fn compress(compressor: u8, data: &[u8]) -> Result<Vec<u8>, WireError> {
    match compressor {
        NOOP => Ok(data.to_vec()),
        SNAPPY => snap::raw::Encoder::new()
            .compress_vec(data)
            .map_err(|e| WireError::Decompress(e.to_string())),
        ZLIB => {
            use std::io::Write;
            let mut enc =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(data)
                .and_then(|_| enc.finish())
                .map_err(|e| WireError::Decompress(e.to_string()))
        }
        ZSTD => zstd::bulk::compress(data, 1).map_err(|e| WireError::Decompress(e.to_string())),
        other => Err(WireError::UnknownCompressor(other)),
    }
}

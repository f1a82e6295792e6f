//! The MongoDB wire protocol as a pure codec: bytes in, typed messages out, and reply frames
//! back. No I/O happens here; the server reads a header, asks [`Header::parse`] whether the
//! rest may be read at all, reads it, and hands the whole frame to [`Request::decode`].
//!
//! Every length is checked before it is trusted: the message length against the configured
//! maximum and against the bytes present, each section and document sequence against what is
//! left of the message, each BSON document's length against its section, and each document's
//! every element (with a bound on nesting, so that a hostile document cannot exhaust the
//! stack of whoever walks it later). A malformed thing is a [`WireError`] of its own kind, and
//! the server closes the connection that sent it.
//!
//! Served: `OP_MSG` (flags, a body section, document sequences, the optional CRC-32C
//! checksum) and the legacy `OP_QUERY` that drivers send their first `isMaster`/`hello` in,
//! answered by `OP_REPLY`. Refused: `OP_COMPRESSED` (the front does not advertise
//! compression, so a driver never compresses) and the other legacy opcodes, which MongoDB
//! removed in 5.1.

use bson::{Bson, Document, RawBsonRef, RawDocument};

/// The length of a message header: messageLength, requestID, responseTo, opCode.
pub const HEADER_LEN: usize = 16;

/// MongoDB's `maxMessageSizeBytes`: the largest message a driver sends or a server answers.
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;

/// How deep documents may nest in a command. MongoDB refuses commands nested deeper than 200
/// levels (`maxBSONDepth`); checking it here bounds every later recursion over a document.
pub const MAX_BSON_DEPTH: usize = 200;

/// The `OP_REPLY` flag that mongod sets in every reply since 1.6.
const REPLY_AWAIT_CAPABLE: i32 = 1 << 3;

/// CRC-32C (Castagnoli), the checksum of `OP_MSG`.
const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// What the codec accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest message, header included, that is read at all.
    pub max_message_size: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_size: MAX_MESSAGE_SIZE,
        }
    }
}

/// The opcodes MongoDB ever defined. Only `Msg` and `Query` are served; the others are named
/// so that a refusal can say what was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpCode {
    Reply,
    Update,
    Insert,
    Reserved,
    Query,
    GetMore,
    Delete,
    KillCursors,
    Command,
    CommandReply,
    Compressed,
    Msg,
}

impl OpCode {
    pub fn from_i32(code: i32) -> Option<OpCode> {
        Some(match code {
            1 => OpCode::Reply,
            2001 => OpCode::Update,
            2002 => OpCode::Insert,
            2003 => OpCode::Reserved,
            2004 => OpCode::Query,
            2005 => OpCode::GetMore,
            2006 => OpCode::Delete,
            2007 => OpCode::KillCursors,
            2010 => OpCode::Command,
            2011 => OpCode::CommandReply,
            2012 => OpCode::Compressed,
            2013 => OpCode::Msg,
            _ => return None,
        })
    }

    pub fn code(self) -> i32 {
        match self {
            OpCode::Reply => 1,
            OpCode::Update => 2001,
            OpCode::Insert => 2002,
            OpCode::Reserved => 2003,
            OpCode::Query => 2004,
            OpCode::GetMore => 2005,
            OpCode::Delete => 2006,
            OpCode::KillCursors => 2007,
            OpCode::Command => 2010,
            OpCode::CommandReply => 2011,
            OpCode::Compressed => 2012,
            OpCode::Msg => 2013,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OpCode::Reply => "OP_REPLY",
            OpCode::Update => "OP_UPDATE",
            OpCode::Insert => "OP_INSERT",
            OpCode::Reserved => "OP_RESERVED",
            OpCode::Query => "OP_QUERY",
            OpCode::GetMore => "OP_GET_MORE",
            OpCode::Delete => "OP_DELETE",
            OpCode::KillCursors => "OP_KILL_CURSORS",
            OpCode::Command => "OP_COMMAND",
            OpCode::CommandReply => "OP_COMMANDREPLY",
            OpCode::Compressed => "OP_COMPRESSED",
            OpCode::Msg => "OP_MSG",
        }
    }
}

impl std::fmt::Display for OpCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// Where in a message a malformed thing was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Header,
    MsgFlags,
    MsgSectionKind,
    MsgBody,
    SequenceLength,
    SequenceIdentifier,
    SequenceDocument,
    Checksum,
    QueryFlags,
    QueryCollection,
    QuerySkipAndReturn,
    QueryDocument,
    QueryFieldSelector,
    ReplyFields,
    ReplyDocument,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Part::Header => "the message header",
            Part::MsgFlags => "the OP_MSG flag bits",
            Part::MsgSectionKind => "an OP_MSG section kind",
            Part::MsgBody => "the OP_MSG body",
            Part::SequenceLength => "a document sequence's length",
            Part::SequenceIdentifier => "a document sequence's identifier",
            Part::SequenceDocument => "a document of a document sequence",
            Part::Checksum => "the OP_MSG checksum",
            Part::QueryFlags => "the OP_QUERY flags",
            Part::QueryCollection => "the OP_QUERY collection name",
            Part::QuerySkipAndReturn => "the OP_QUERY numberToSkip and numberToReturn",
            Part::QueryDocument => "the OP_QUERY query document",
            Part::QueryFieldSelector => "the OP_QUERY field selector",
            Part::ReplyFields => "the OP_REPLY fields",
            Part::ReplyDocument => "an OP_REPLY document",
        })
    }
}

/// A malformed or refused message. The server closes the connection that sent it and logs
/// this as the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message length {length} is shorter than a message header ({HEADER_LEN} bytes)")]
    ShorterThanHeader { length: i64 },
    #[error("the message length {length} exceeds the maximum of {max} bytes")]
    TooLong { length: usize, max: usize },
    #[error("the header says {declared} bytes but {present} are present")]
    LengthMismatch { declared: usize, present: usize },
    #[error("unknown opcode {0}")]
    UnknownOpCode(i32),
    #[error("opcode {0} is not served")]
    UnsupportedOpCode(OpCode),
    #[error("{part} is cut short: {needed} bytes needed, {left} left")]
    Truncated {
        part: Part,
        needed: usize,
        left: usize,
    },
    #[error("OP_MSG flag bits {0:#06x} are required bits this server does not know")]
    UnknownRequiredFlags(u32),
    #[error("the OP_MSG checksum {found:#010x} does not match the contents ({computed:#010x})")]
    ChecksumMismatch { found: u32, computed: u32 },
    #[error("unknown OP_MSG section kind {0}")]
    UnknownSectionKind(u8),
    #[error("a document sequence's length {declared} does not fit in the {left} bytes left")]
    SequenceLength { declared: i32, left: usize },
    #[error("{0} is not a NUL-terminated UTF-8 string")]
    BadCString(Part),
    #[error("the OP_MSG has no body section")]
    NoBody,
    #[error("the OP_MSG has more than one body section")]
    MultipleBodies,
    #[error("the OP_MSG has two document sequences named {0:?}")]
    DuplicateSequence(String),
    #[error("the OP_MSG body has a field named like its document sequence {0:?}")]
    SequenceShadowsBody(String),
    #[error("{part}: a document length {declared} does not fit in the {left} bytes left")]
    DocumentLength {
        part: Part,
        declared: i32,
        left: usize,
    },
    #[error("{part} is not valid BSON: {reason}")]
    InvalidBson { part: Part, reason: String },
    #[error("{0} nests documents deeper than {MAX_BSON_DEPTH} levels")]
    TooDeep(Part),
    #[error("{part} is followed by {count} bytes that belong to nothing")]
    TrailingBytes { part: Part, count: usize },
    #[error(
        "an OP_QUERY to {0:?}: only commands (`<database>.$cmd`) are served over the legacy \
         opcode"
    )]
    QueryNotCommand(String),
    #[error("the reply cannot be encoded: {0}")]
    Unencodable(String),
}

/// A message header. `message_length` is checked by [`Header::parse`] before anything else of
/// the message is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub message_length: usize,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: OpCode,
}

impl Header {
    /// Reads and checks a header: the length is at least a header and at most the limit, and
    /// the opcode is one this codec decodes. The server calls this on the first 16 bytes, so
    /// that a message that is too large or of an unknown kind is refused before its body is
    /// read.
    pub fn parse(bytes: &[u8], limits: &Limits) -> Result<Header, WireError> {
        let mut reader = Reader::new(bytes);
        let length = reader.i32(Part::Header)?;
        let request_id = reader.i32(Part::Header)?;
        let response_to = reader.i32(Part::Header)?;
        let op_code = reader.i32(Part::Header)?;
        let message_length = usize::try_from(length)
            .ok()
            .filter(|l| *l >= HEADER_LEN)
            .ok_or(WireError::ShorterThanHeader {
                length: i64::from(length),
            })?;
        if message_length > limits.max_message_size {
            return Err(WireError::TooLong {
                length: message_length,
                max: limits.max_message_size,
            });
        }
        let op_code = OpCode::from_i32(op_code).ok_or(WireError::UnknownOpCode(op_code))?;
        match op_code {
            OpCode::Msg | OpCode::Query | OpCode::Reply => {}
            other => return Err(WireError::UnsupportedOpCode(other)),
        }
        Ok(Header {
            message_length,
            request_id,
            response_to,
            op_code,
        })
    }
}

/// `OP_MSG` flag bits. The low 16 bits are required: a receiver must refuse a message with one
/// it does not know. The high 16 are optional and ignored when unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgFlags(pub u32);

impl MsgFlags {
    /// The message ends with a CRC-32C of everything before it.
    pub const CHECKSUM_PRESENT: u32 = 1;
    /// The sender will not wait for a reply (a request) or another reply follows (a reply).
    pub const MORE_TO_COME: u32 = 1 << 1;
    /// The client accepts several replies to one request (exhaust cursors, streaming hello).
    pub const EXHAUST_ALLOWED: u32 = 1 << 16;
    const REQUIRED: u32 = 0xffff;
    const KNOWN_REQUIRED: u32 = Self::CHECKSUM_PRESENT | Self::MORE_TO_COME;

    pub fn checksum_present(self) -> bool {
        self.0 & Self::CHECKSUM_PRESENT != 0
    }

    pub fn more_to_come(self) -> bool {
        self.0 & Self::MORE_TO_COME != 0
    }

    pub fn exhaust_allowed(self) -> bool {
        self.0 & Self::EXHAUST_ALLOWED != 0
    }
}

/// One section of an `OP_MSG`.
#[derive(Clone, Debug, PartialEq)]
pub enum Section {
    /// Kind 0: the command document.
    Body(Document),
    /// Kind 1: documents that belong to the command as the array field `identifier` (the
    /// `documents` of an `insert`, the `updates` of an `update`).
    Sequence {
        identifier: String,
        documents: Vec<Document>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpMsg {
    /// With `CHECKSUM_PRESENT` set, encoding appends the checksum.
    pub flags: MsgFlags,
    pub sections: Vec<Section>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpQuery {
    pub flags: i32,
    pub full_collection_name: String,
    pub number_to_skip: i32,
    pub number_to_return: i32,
    pub query: Document,
    pub return_fields_selector: Option<Document>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OpReply {
    pub response_flags: i32,
    pub cursor_id: i64,
    pub starting_from: i32,
    pub documents: Vec<Document>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Msg(OpMsg),
    Query(OpQuery),
    Reply(OpReply),
}

/// A whole message: the header's ids and the operation (the length and opcode follow from
/// the operation when it is encoded).
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub request_id: i32,
    pub response_to: i32,
    pub op: Op,
}

impl Message {
    /// Decodes one whole message (header included), checking everything.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Message, WireError> {
        let header = Header::parse(bytes, limits)?;
        if header.message_length != bytes.len() {
            return Err(WireError::LengthMismatch {
                declared: header.message_length,
                present: bytes.len(),
            });
        }
        let op = match header.op_code {
            OpCode::Msg => Op::Msg(decode_msg(bytes)?),
            OpCode::Query => Op::Query(decode_query(&bytes[HEADER_LEN..])?),
            OpCode::Reply => Op::Reply(decode_reply(&bytes[HEADER_LEN..])?),
            other => return Err(WireError::UnsupportedOpCode(other)),
        };
        Ok(Message {
            request_id: header.request_id,
            response_to: header.response_to,
            op,
        })
    }

    /// Encodes the message, computing its length and, for an `OP_MSG` with
    /// `CHECKSUM_PRESENT`, its checksum.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&[0; 4]); // the length, written last
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.extend_from_slice(&self.response_to.to_le_bytes());
        let op_code = match &self.op {
            Op::Msg(_) => OpCode::Msg,
            Op::Query(_) => OpCode::Query,
            Op::Reply(_) => OpCode::Reply,
        };
        out.extend_from_slice(&op_code.code().to_le_bytes());
        match &self.op {
            Op::Msg(msg) => {
                out.extend_from_slice(&msg.flags.0.to_le_bytes());
                for section in &msg.sections {
                    match section {
                        Section::Body(body) => {
                            out.push(0);
                            write_document(&mut out, body)?;
                        }
                        Section::Sequence {
                            identifier,
                            documents,
                        } => {
                            out.push(1);
                            let at = out.len();
                            out.extend_from_slice(&[0; 4]);
                            write_cstring(&mut out, identifier)?;
                            for document in documents {
                                write_document(&mut out, document)?;
                            }
                            let length = length_field(out.len() - at)?;
                            out[at..at + 4].copy_from_slice(&length.to_le_bytes());
                        }
                    }
                }
                if msg.flags.checksum_present() {
                    // The checksum covers the final length, so the length is written first.
                    let length = length_field(out.len() + 4)?;
                    out[..4].copy_from_slice(&length.to_le_bytes());
                    let checksum = CRC32C.checksum(&out);
                    out.extend_from_slice(&checksum.to_le_bytes());
                }
            }
            Op::Query(query) => {
                out.extend_from_slice(&query.flags.to_le_bytes());
                write_cstring(&mut out, &query.full_collection_name)?;
                out.extend_from_slice(&query.number_to_skip.to_le_bytes());
                out.extend_from_slice(&query.number_to_return.to_le_bytes());
                write_document(&mut out, &query.query)?;
                if let Some(selector) = &query.return_fields_selector {
                    write_document(&mut out, selector)?;
                }
            }
            Op::Reply(reply) => {
                out.extend_from_slice(&reply.response_flags.to_le_bytes());
                out.extend_from_slice(&reply.cursor_id.to_le_bytes());
                out.extend_from_slice(&reply.starting_from.to_le_bytes());
                let returned = i32::try_from(reply.documents.len())
                    .map_err(|_| WireError::Unencodable("too many documents".into()))?;
                out.extend_from_slice(&returned.to_le_bytes());
                for document in &reply.documents {
                    write_document(&mut out, document)?;
                }
            }
        }
        let length = length_field(out.len())?;
        out[..4].copy_from_slice(&length.to_le_bytes());
        Ok(out)
    }
}

/// How a request arrived, which decides how it is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestForm {
    /// An `OP_MSG`, answered by an `OP_MSG` (with a checksum when the request had one).
    Msg { flags: MsgFlags },
    /// A legacy `OP_QUERY` on `<database>.$cmd`, answered by an `OP_REPLY`.
    Query { full_collection_name: String },
}

/// A command as the front handles it, whatever opcode carried it.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub request_id: i32,
    /// The command document. An `OP_MSG`'s document sequences are folded into it as array
    /// fields named by their identifiers, as MongoDB does. An `OP_QUERY`'s command is taken out
    /// of its `$query` wrapper (with `$readPreference` kept beside it) and gets `$db` from the
    /// collection name when it has none.
    pub command: Document,
    pub form: RequestForm,
}

impl Request {
    /// Decodes one whole message into a request.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Request, WireError> {
        Request::from_message(Message::decode(bytes, limits)?)
    }

    /// The request a decoded message carries. Replies are not requests.
    pub fn from_message(message: Message) -> Result<Request, WireError> {
        match message.op {
            Op::Msg(msg) => {
                let mut body = None;
                let mut sequences = Vec::new();
                for section in msg.sections {
                    match section {
                        Section::Body(document) => {
                            if body.replace(document).is_some() {
                                return Err(WireError::MultipleBodies);
                            }
                        }
                        Section::Sequence {
                            identifier,
                            documents,
                        } => sequences.push((identifier, documents)),
                    }
                }
                let mut command = body.ok_or(WireError::NoBody)?;
                let mut seen = std::collections::BTreeSet::new();
                for (identifier, documents) in sequences {
                    if !seen.insert(identifier.clone()) {
                        return Err(WireError::DuplicateSequence(identifier));
                    }
                    if command.contains_key(&identifier) {
                        return Err(WireError::SequenceShadowsBody(identifier));
                    }
                    let array = documents.into_iter().map(Bson::Document).collect();
                    command.insert(identifier, Bson::Array(array));
                }
                Ok(Request {
                    request_id: message.request_id,
                    command,
                    form: RequestForm::Msg { flags: msg.flags },
                })
            }
            Op::Query(query) => {
                let database = match query.full_collection_name.split_once('.') {
                    Some((database, "$cmd")) if !database.is_empty() => database.to_owned(),
                    _ => return Err(WireError::QueryNotCommand(query.full_collection_name)),
                };
                let mut command = unwrap_query(query.query);
                if !command.contains_key("$db") {
                    command.insert("$db", database);
                }
                Ok(Request {
                    request_id: message.request_id,
                    command,
                    form: RequestForm::Query {
                        full_collection_name: query.full_collection_name,
                    },
                })
            }
            Op::Reply(_) => Err(WireError::UnsupportedOpCode(OpCode::Reply)),
        }
    }

    /// The command's name: its first key, when it has one.
    pub fn command_name(&self) -> Option<&str> {
        self.command.keys().next().map(String::as_str)
    }

    /// Whether the client waits for an answer: every request but an `OP_MSG` with
    /// `moreToCome` (a fire-and-forget write).
    pub fn expects_reply(&self) -> bool {
        match &self.form {
            RequestForm::Msg { flags } => !flags.more_to_come(),
            RequestForm::Query { .. } => true,
        }
    }

    /// The frame that answers this request with `body`, in the request's own form: an
    /// `OP_MSG` (checksummed when the request was) or an `OP_REPLY`. A reply never sets
    /// `moreToCome`: the front does not stream, which `exhaustAllowed` permits.
    pub fn reply(&self, request_id: i32, body: Document) -> Result<Vec<u8>, WireError> {
        let op = match &self.form {
            RequestForm::Msg { flags } => Op::Msg(OpMsg {
                flags: MsgFlags(if flags.checksum_present() {
                    MsgFlags::CHECKSUM_PRESENT
                } else {
                    0
                }),
                sections: vec![Section::Body(body)],
            }),
            RequestForm::Query { .. } => Op::Reply(OpReply {
                response_flags: REPLY_AWAIT_CAPABLE,
                cursor_id: 0,
                starting_from: 0,
                documents: vec![body],
            }),
        };
        Message {
            request_id,
            response_to: self.request_id,
            op,
        }
        .encode()
    }
}

/// A legacy command may come wrapped, as `{$query: {isMaster: 1}, $readPreference: {...}}`
/// (drivers wrap it to pass a read preference to a `mongos`): the command is the inner
/// document, with the read preference kept beside it.
fn unwrap_query(mut query: Document) -> Document {
    let wrapped = ["$query", "query"]
        .into_iter()
        .find(|key| matches!(query.get(*key), Some(Bson::Document(_))));
    let Some(key) = wrapped else {
        return query;
    };
    let Some(Bson::Document(mut inner)) = query.remove(key) else {
        return query;
    };
    if let Some(preference) = query.remove("$readPreference") {
        inner.insert("$readPreference", preference);
    }
    inner
}

fn decode_msg(bytes: &[u8]) -> Result<OpMsg, WireError> {
    let mut reader = Reader::new(&bytes[HEADER_LEN..]);
    let flags = MsgFlags(reader.u32(Part::MsgFlags)?);
    let unknown = flags.0 & MsgFlags::REQUIRED & !MsgFlags::KNOWN_REQUIRED;
    if unknown != 0 {
        return Err(WireError::UnknownRequiredFlags(unknown));
    }
    let mut sections_end = bytes.len();
    if flags.checksum_present() {
        // The checksum is the last four bytes and covers everything before them.
        let left = reader.left();
        if left < 4 {
            return Err(WireError::Truncated {
                part: Part::Checksum,
                needed: 4,
                left,
            });
        }
        sections_end -= 4;
        let mut found = [0; 4];
        found.copy_from_slice(&bytes[sections_end..]);
        let found = u32::from_le_bytes(found);
        let computed = CRC32C.checksum(&bytes[..sections_end]);
        if found != computed {
            return Err(WireError::ChecksumMismatch { found, computed });
        }
    }
    let mut reader = Reader::new(&bytes[HEADER_LEN + 4..sections_end]);
    let mut sections = Vec::new();
    while reader.left() > 0 {
        match reader.u8(Part::MsgSectionKind)? {
            0 => sections.push(Section::Body(reader.document(Part::MsgBody)?)),
            1 => {
                let declared = reader.i32(Part::SequenceLength)?;
                // The length counts its own four bytes.
                let left = reader.left();
                let content = usize::try_from(declared)
                    .ok()
                    .and_then(|d| d.checked_sub(4))
                    .filter(|c| *c <= left)
                    .ok_or(WireError::SequenceLength {
                        declared,
                        left: left + 4,
                    })?;
                let mut sequence = Reader::new(reader.take(content, Part::SequenceLength)?);
                let identifier = sequence.cstring(Part::SequenceIdentifier)?.to_owned();
                let mut documents = Vec::new();
                while sequence.left() > 0 {
                    documents.push(sequence.document(Part::SequenceDocument)?);
                }
                sections.push(Section::Sequence {
                    identifier,
                    documents,
                });
            }
            kind => return Err(WireError::UnknownSectionKind(kind)),
        }
    }
    // One body, checked here as well as when the request is built, so that a decoded message
    // is always one a request can be made of.
    match sections
        .iter()
        .filter(|s| matches!(s, Section::Body(_)))
        .count()
    {
        0 => return Err(WireError::NoBody),
        1 => {}
        _ => return Err(WireError::MultipleBodies),
    }
    Ok(OpMsg { flags, sections })
}

fn decode_query(bytes: &[u8]) -> Result<OpQuery, WireError> {
    let mut reader = Reader::new(bytes);
    let flags = reader.i32(Part::QueryFlags)?;
    let full_collection_name = reader.cstring(Part::QueryCollection)?.to_owned();
    let number_to_skip = reader.i32(Part::QuerySkipAndReturn)?;
    let number_to_return = reader.i32(Part::QuerySkipAndReturn)?;
    let query = reader.document(Part::QueryDocument)?;
    let return_fields_selector = if reader.left() > 0 {
        Some(reader.document(Part::QueryFieldSelector)?)
    } else {
        None
    };
    if reader.left() > 0 {
        return Err(WireError::TrailingBytes {
            part: Part::QueryFieldSelector,
            count: reader.left(),
        });
    }
    Ok(OpQuery {
        flags,
        full_collection_name,
        number_to_skip,
        number_to_return,
        query,
        return_fields_selector,
    })
}

fn decode_reply(bytes: &[u8]) -> Result<OpReply, WireError> {
    let mut reader = Reader::new(bytes);
    let response_flags = reader.i32(Part::ReplyFields)?;
    let cursor_id = reader.i64(Part::ReplyFields)?;
    let starting_from = reader.i32(Part::ReplyFields)?;
    let returned = reader.i32(Part::ReplyFields)?;
    let mut documents = Vec::new();
    while reader.left() > 0 {
        documents.push(reader.document(Part::ReplyDocument)?);
    }
    if usize::try_from(returned).ok() != Some(documents.len()) {
        return Err(WireError::InvalidBson {
            part: Part::ReplyFields,
            reason: format!(
                "numberReturned is {returned} but {} documents follow",
                documents.len()
            ),
        });
    }
    Ok(OpReply {
        response_flags,
        cursor_id,
        starting_from,
        documents,
    })
}

/// A cursor over a message's bytes whose every read checks what is left.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn left(&self) -> usize {
        self.bytes.len()
    }

    fn take(&mut self, n: usize, part: Part) -> Result<&'a [u8], WireError> {
        if n > self.bytes.len() {
            return Err(WireError::Truncated {
                part,
                needed: n,
                left: self.bytes.len(),
            });
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, part: Part) -> Result<[u8; N], WireError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, part)?);
        Ok(out)
    }

    fn u8(&mut self, part: Part) -> Result<u8, WireError> {
        Ok(self.array::<1>(part)?[0])
    }

    fn i32(&mut self, part: Part) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array(part)?))
    }

    fn u32(&mut self, part: Part) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(part)?))
    }

    fn i64(&mut self, part: Part) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array(part)?))
    }

    fn cstring(&mut self, part: Part) -> Result<&'a str, WireError> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or(WireError::BadCString(part))?;
        let text =
            std::str::from_utf8(&self.bytes[..end]).map_err(|_| WireError::BadCString(part))?;
        self.bytes = &self.bytes[end + 1..];
        Ok(text)
    }

    /// One BSON document: its length checked against what is left, then every element of it,
    /// nested ones included, before it is converted.
    fn document(&mut self, part: Part) -> Result<Document, WireError> {
        let left = self.left();
        if left < 4 {
            return Err(WireError::Truncated {
                part,
                needed: 4,
                left,
            });
        }
        let declared =
            i32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]]);
        let length = usize::try_from(declared)
            .ok()
            .filter(|l| *l >= 5 && *l <= left)
            .ok_or(WireError::DocumentLength {
                part,
                declared,
                left,
            })?;
        let bytes = self.take(length, part)?;
        let raw = RawDocument::from_bytes(bytes).map_err(|e| WireError::InvalidBson {
            part,
            reason: e.to_string(),
        })?;
        check_document(raw, 1, part)?;
        Document::try_from(raw).map_err(|e| WireError::InvalidBson {
            part,
            reason: e.to_string(),
        })
    }
}

/// Walks every element of a document, so that a malformed element anywhere is found here and
/// nesting is bounded before anything recurses over the converted document.
fn check_document(document: &RawDocument, depth: usize, part: Part) -> Result<(), WireError> {
    if depth > MAX_BSON_DEPTH {
        return Err(WireError::TooDeep(part));
    }
    for element in document {
        let (_, value) = element.map_err(|e| WireError::InvalidBson {
            part,
            reason: e.to_string(),
        })?;
        check_value(value, depth, part)?;
    }
    Ok(())
}

fn check_value(value: RawBsonRef<'_>, depth: usize, part: Part) -> Result<(), WireError> {
    match value {
        RawBsonRef::Document(inner) => check_document(inner, depth + 1, part),
        RawBsonRef::Array(array) => {
            if depth + 1 > MAX_BSON_DEPTH {
                return Err(WireError::TooDeep(part));
            }
            for item in array {
                let item = item.map_err(|e| WireError::InvalidBson {
                    part,
                    reason: e.to_string(),
                })?;
                check_value(item, depth + 1, part)?;
            }
            Ok(())
        }
        RawBsonRef::JavaScriptCodeWithScope(code) => check_document(code.scope, depth + 1, part),
        _ => Ok(()),
    }
}

fn write_document(out: &mut Vec<u8>, document: &Document) -> Result<(), WireError> {
    document
        .to_writer(out)
        .map_err(|e| WireError::Unencodable(e.to_string()))
}

fn write_cstring(out: &mut Vec<u8>, text: &str) -> Result<(), WireError> {
    if text.contains('\0') {
        return Err(WireError::Unencodable(format!(
            "{text:?} holds a NUL byte and cannot be a C string"
        )));
    }
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    Ok(())
}

fn length_field(length: usize) -> Result<i32, WireError> {
    i32::try_from(length).map_err(|_| WireError::Unencodable(format!("{length} bytes")))
}

#[cfg(test)]
mod tests;

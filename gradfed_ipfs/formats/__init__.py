"""Bytes to objects and back, with no I/O: Arrow blocks, records, pubsub, statements.

Everything a peer sends is decoded here, so this is where sizes and nesting are checked.
"""

from __future__ import annotations

from .announcement import ANNOUNCEMENT_VERSION, MAX_MESSAGE_BYTES, Announcement, AnnouncementFilter
from .arrow import (
    MAX_DECODED_ELEMENTS,
    DecodedGradient,
    decode_dense_block,
    decode_gradient,
    encode_arrow_file,
    load_gradient_from_arrow,
    load_layer_from_arrow,
    open_arrow_file,
    store_gradient_as_arrow,
    store_layer_as_arrow,
)
from .packed import PACKED_HEADER_BYTES, decode_packed_chunk, encode_packed_chunk, is_packed
from .pubsub import TOPIC_PREFIX, PubsubMessage, parse_sub_line, session_topic
from .records import decode_record, encode_record, from_link, require, to_link
from .statement import (
    PEER_ID_KEYS,
    DelegatedSigner,
    KeyBook,
    KeyDirectory,
    LocalSigner,
    Signer,
    Statement,
    decode_statement,
    sign_statement,
)

__all__ = [
    "PEER_ID_KEYS",
    "KeyBook",
    "KeyDirectory",
    "ANNOUNCEMENT_VERSION",
    "MAX_DECODED_ELEMENTS",
    "MAX_MESSAGE_BYTES",
    "PACKED_HEADER_BYTES",
    "TOPIC_PREFIX",
    "Announcement",
    "AnnouncementFilter",
    "DecodedGradient",
    "DelegatedSigner",
    "LocalSigner",
    "PubsubMessage",
    "Signer",
    "Statement",
    "decode_dense_block",
    "decode_gradient",
    "decode_packed_chunk",
    "decode_record",
    "decode_statement",
    "encode_arrow_file",
    "encode_packed_chunk",
    "encode_record",
    "from_link",
    "is_packed",
    "load_gradient_from_arrow",
    "load_layer_from_arrow",
    "open_arrow_file",
    "parse_sub_line",
    "require",
    "session_topic",
    "sign_statement",
    "store_gradient_as_arrow",
    "store_layer_as_arrow",
    "to_link",
]

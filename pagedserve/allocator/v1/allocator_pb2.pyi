from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_STATUS_OK: _ClassVar[OpStatus]
    OP_STATUS_OUT_OF_BLOCKS: _ClassVar[OpStatus]
    OP_STATUS_NOT_FOUND: _ClassVar[OpStatus]
    OP_STATUS_ALREADY_EXISTS: _ClassVar[OpStatus]
    OP_STATUS_TOO_LARGE: _ClassVar[OpStatus]

class BlockState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BLOCK_STATE_UNSPECIFIED: _ClassVar[BlockState]
    BLOCK_STATE_FREE: _ClassVar[BlockState]
    BLOCK_STATE_CACHED_FREE: _ClassVar[BlockState]
    BLOCK_STATE_USED: _ClassVar[BlockState]

class KvEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_EVENT_TYPE_UNSPECIFIED: _ClassVar[KvEventType]
    KV_EVENT_TYPE_BLOCK_STORED: _ClassVar[KvEventType]
    KV_EVENT_TYPE_BLOCK_REMOVED: _ClassVar[KvEventType]
    KV_EVENT_TYPE_POOL_RESET: _ClassVar[KvEventType]
OP_STATUS_OK: OpStatus
OP_STATUS_OUT_OF_BLOCKS: OpStatus
OP_STATUS_NOT_FOUND: OpStatus
OP_STATUS_ALREADY_EXISTS: OpStatus
OP_STATUS_TOO_LARGE: OpStatus
BLOCK_STATE_UNSPECIFIED: BlockState
BLOCK_STATE_FREE: BlockState
BLOCK_STATE_CACHED_FREE: BlockState
BLOCK_STATE_USED: BlockState
KV_EVENT_TYPE_UNSPECIFIED: KvEventType
KV_EVENT_TYPE_BLOCK_STORED: KvEventType
KV_EVENT_TYPE_BLOCK_REMOVED: KvEventType
KV_EVENT_TYPE_POOL_RESET: KvEventType

class RegisterExecutorRequest(_message.Message):
    __slots__ = ("executor_id", "address", "num_blocks", "block_size", "model_fingerprint", "executor_index")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    address: str
    num_blocks: int
    block_size: int
    model_fingerprint: str
    executor_index: int
    def __init__(self, executor_id: _Optional[str] = ..., address: _Optional[str] = ..., num_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., executor_index: _Optional[int] = ...) -> None: ...

class RegisterExecutorResponse(_message.Message):
    __slots__ = ("epoch", "lease_ttl_s", "step_channel_port")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    STEP_CHANNEL_PORT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    lease_ttl_s: float
    step_channel_port: int
    def __init__(self, epoch: _Optional[int] = ..., lease_ttl_s: _Optional[float] = ..., step_channel_port: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("executor_id", "epoch", "num_waiting", "num_running")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    epoch: int
    num_waiting: int
    num_running: int
    def __init__(self, executor_id: _Optional[str] = ..., epoch: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_ttl_s", "step_channel_port")
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    STEP_CHANNEL_PORT_FIELD_NUMBER: _ClassVar[int]
    lease_ttl_s: float
    step_channel_port: int
    def __init__(self, lease_ttl_s: _Optional[float] = ..., step_channel_port: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("executor_id", "epoch", "step_id", "ops")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    epoch: int
    step_id: int
    ops: _containers.RepeatedCompositeFieldContainer[BlockOp]
    def __init__(self, executor_id: _Optional[str] = ..., epoch: _Optional[int] = ..., step_id: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[BlockOp, _Mapping]]] = ...) -> None: ...

class StepChannelHello(_message.Message):
    __slots__ = ("executor_id", "auth_token")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    auth_token: str
    def __init__(self, executor_id: _Optional[str] = ..., auth_token: _Optional[str] = ...) -> None: ...

class BlockOp(_message.Message):
    __slots__ = ("allocate", "append", "fork", "free")
    ALLOCATE_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    allocate: AllocateOp
    append: AppendOp
    fork: ForkOp
    free: FreeOp
    def __init__(self, allocate: _Optional[_Union[AllocateOp, _Mapping]] = ..., append: _Optional[_Union[AppendOp, _Mapping]] = ..., fork: _Optional[_Union[ForkOp, _Mapping]] = ..., free: _Optional[_Union[FreeOp, _Mapping]] = ...) -> None: ...

class AllocateOp(_message.Message):
    __slots__ = ("seq_id", "token_ids", "cache_salt", "lookahead_slots", "packed_token_ids")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PACKED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: str
    lookahead_slots: int
    packed_token_ids: bytes
    def __init__(self, seq_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[str] = ..., lookahead_slots: _Optional[int] = ..., packed_token_ids: _Optional[bytes] = ...) -> None: ...

class AppendOp(_message.Message):
    __slots__ = ("seq_id", "token_ids", "lookahead_slots", "num_computed_tokens", "packed_token_ids")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PACKED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    lookahead_slots: int
    num_computed_tokens: int
    packed_token_ids: bytes
    def __init__(self, seq_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., lookahead_slots: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., packed_token_ids: _Optional[bytes] = ...) -> None: ...

class ForkOp(_message.Message):
    __slots__ = ("parent_seq_id", "child_seq_id")
    PARENT_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    parent_seq_id: str
    child_seq_id: str
    def __init__(self, parent_seq_id: _Optional[str] = ..., child_seq_id: _Optional[str] = ...) -> None: ...

class FreeOp(_message.Message):
    __slots__ = ("seq_id",)
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    def __init__(self, seq_id: _Optional[str] = ...) -> None: ...

class BlockCopy(_message.Message):
    __slots__ = ("src_block", "dst_block")
    SRC_BLOCK_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_FIELD_NUMBER: _ClassVar[int]
    src_block: int
    dst_block: int
    def __init__(self, src_block: _Optional[int] = ..., dst_block: _Optional[int] = ...) -> None: ...

class OpResult(_message.Message):
    __slots__ = ("status", "message", "block_table", "num_cached_tokens", "new_blocks", "copies")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLE_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    status: OpStatus
    message: str
    block_table: _containers.RepeatedScalarFieldContainer[int]
    num_cached_tokens: int
    new_blocks: _containers.RepeatedScalarFieldContainer[int]
    copies: _containers.RepeatedCompositeFieldContainer[BlockCopy]
    def __init__(self, status: _Optional[_Union[OpStatus, str]] = ..., message: _Optional[str] = ..., block_table: _Optional[_Iterable[int]] = ..., num_cached_tokens: _Optional[int] = ..., new_blocks: _Optional[_Iterable[int]] = ..., copies: _Optional[_Iterable[_Union[BlockCopy, _Mapping]]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results", "replayed", "num_free_blocks")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[OpResult]
    replayed: bool
    num_free_blocks: int
    def __init__(self, results: _Optional[_Iterable[_Union[OpResult, _Mapping]]] = ..., replayed: bool = ..., num_free_blocks: _Optional[int] = ...) -> None: ...

class MatchPrefixRequest(_message.Message):
    __slots__ = ("token_ids", "cache_salt")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class ExecutorMatch(_message.Message):
    __slots__ = ("executor_id", "address", "num_cached_tokens", "num_free_blocks", "num_blocks", "num_waiting", "num_running", "num_sequences")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    address: str
    num_cached_tokens: int
    num_free_blocks: int
    num_blocks: int
    num_waiting: int
    num_running: int
    num_sequences: int
    def __init__(self, executor_id: _Optional[str] = ..., address: _Optional[str] = ..., num_cached_tokens: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_blocks: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., num_sequences: _Optional[int] = ...) -> None: ...

class MatchPrefixResponse(_message.Message):
    __slots__ = ("executors",)
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    executors: _containers.RepeatedCompositeFieldContainer[ExecutorMatch]
    def __init__(self, executors: _Optional[_Iterable[_Union[ExecutorMatch, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class RefcountBucket(_message.Message):
    __slots__ = ("ref_count", "num_blocks")
    REF_COUNT_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ref_count: int
    num_blocks: int
    def __init__(self, ref_count: _Optional[int] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("executor_id", "num_blocks", "num_free_blocks", "num_cached_free_blocks", "num_used_blocks", "usage_percent", "prefix_query_tokens", "prefix_hit_tokens", "prefix_hit_rate", "tokens_stored", "slots_allocated", "refcount_histogram", "num_sequences", "block_size")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    USAGE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_STORED_FIELD_NUMBER: _ClassVar[int]
    SLOTS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    REFCOUNT_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    num_blocks: int
    num_free_blocks: int
    num_cached_free_blocks: int
    num_used_blocks: int
    usage_percent: float
    prefix_query_tokens: int
    prefix_hit_tokens: int
    prefix_hit_rate: float
    tokens_stored: int
    slots_allocated: int
    refcount_histogram: _containers.RepeatedCompositeFieldContainer[RefcountBucket]
    num_sequences: int
    block_size: int
    def __init__(self, executor_id: _Optional[str] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_cached_free_blocks: _Optional[int] = ..., num_used_blocks: _Optional[int] = ..., usage_percent: _Optional[float] = ..., prefix_query_tokens: _Optional[int] = ..., prefix_hit_tokens: _Optional[int] = ..., prefix_hit_rate: _Optional[float] = ..., tokens_stored: _Optional[int] = ..., slots_allocated: _Optional[int] = ..., refcount_histogram: _Optional[_Iterable[_Union[RefcountBucket, _Mapping]]] = ..., num_sequences: _Optional[int] = ..., block_size: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("pools", "total", "state_store", "applied_seq")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    STATE_STORE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStats]
    total: PoolStats
    state_store: str
    applied_seq: int
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolStats, _Mapping]]] = ..., total: _Optional[_Union[PoolStats, _Mapping]] = ..., state_store: _Optional[str] = ..., applied_seq: _Optional[int] = ...) -> None: ...

class ListExecutorsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecutorInfo(_message.Message):
    __slots__ = ("executor_id", "address", "epoch", "num_blocks", "block_size", "model_fingerprint", "lease_remaining_s", "num_waiting", "num_running", "last_step_id", "executor_index")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_INDEX_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    address: str
    epoch: int
    num_blocks: int
    block_size: int
    model_fingerprint: str
    lease_remaining_s: float
    num_waiting: int
    num_running: int
    last_step_id: int
    executor_index: int
    def __init__(self, executor_id: _Optional[str] = ..., address: _Optional[str] = ..., epoch: _Optional[int] = ..., num_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., lease_remaining_s: _Optional[float] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., last_step_id: _Optional[int] = ..., executor_index: _Optional[int] = ...) -> None: ...

class ListExecutorsResponse(_message.Message):
    __slots__ = ("executors",)
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    executors: _containers.RepeatedCompositeFieldContainer[ExecutorInfo]
    def __init__(self, executors: _Optional[_Iterable[_Union[ExecutorInfo, _Mapping]]] = ...) -> None: ...

class ListSequencesRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class SequenceInfo(_message.Message):
    __slots__ = ("executor_id", "seq_id", "num_tokens", "num_blocks", "num_cached_tokens", "num_computed_tokens")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    seq_id: str
    num_tokens: int
    num_blocks: int
    num_cached_tokens: int
    num_computed_tokens: int
    def __init__(self, executor_id: _Optional[str] = ..., seq_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., num_blocks: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ...) -> None: ...

class ListSequencesResponse(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[SequenceInfo]
    def __init__(self, sequences: _Optional[_Iterable[_Union[SequenceInfo, _Mapping]]] = ...) -> None: ...

class GetBlockTableRequest(_message.Message):
    __slots__ = ("executor_id", "seq_id")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    seq_id: str
    def __init__(self, executor_id: _Optional[str] = ..., seq_id: _Optional[str] = ...) -> None: ...

class GetBlockTableResponse(_message.Message):
    __slots__ = ("executor_id", "seq_id", "block_ids", "num_tokens", "block_size")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    seq_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    block_size: int
    def __init__(self, executor_id: _Optional[str] = ..., seq_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ..., block_size: _Optional[int] = ...) -> None: ...

class DumpBlocksRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class BlockInfo(_message.Message):
    __slots__ = ("block_id", "state", "ref_count", "block_hash", "num_tokens", "parent_block_hash")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENT_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    state: BlockState
    ref_count: int
    block_hash: bytes
    num_tokens: int
    parent_block_hash: bytes
    def __init__(self, block_id: _Optional[int] = ..., state: _Optional[_Union[BlockState, str]] = ..., ref_count: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., num_tokens: _Optional[int] = ..., parent_block_hash: _Optional[bytes] = ...) -> None: ...

class DumpBlocksResponse(_message.Message):
    __slots__ = ("executor_id", "block_size", "blocks", "free_list")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_LIST_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    block_size: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockInfo]
    free_list: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, executor_id: _Optional[str] = ..., block_size: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockInfo, _Mapping]]] = ..., free_list: _Optional[_Iterable[int]] = ...) -> None: ...

class AuditRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AuditResponse(_message.Message):
    __slots__ = ("violations", "num_pools", "num_blocks")
    VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_POOLS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    violations: _containers.RepeatedScalarFieldContainer[str]
    num_pools: int
    num_blocks: int
    def __init__(self, violations: _Optional[_Iterable[str]] = ..., num_pools: _Optional[int] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class ResetPrefixCacheRequest(_message.Message):
    __slots__ = ("executor_id",)
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    def __init__(self, executor_id: _Optional[str] = ...) -> None: ...

class ResetPrefixCacheResponse(_message.Message):
    __slots__ = ("num_entries_dropped",)
    NUM_ENTRIES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    num_entries_dropped: int
    def __init__(self, num_entries_dropped: _Optional[int] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("from_seq", "follow")
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    follow: bool
    def __init__(self, from_seq: _Optional[int] = ..., follow: bool = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("seq", "type", "executor_id", "block_id", "block_hash", "parent_block_hash", "token_ids", "reason", "num_blocks", "block_size")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PARENT_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    type: KvEventType
    executor_id: str
    block_id: int
    block_hash: bytes
    parent_block_hash: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    num_blocks: int
    block_size: int
    def __init__(self, seq: _Optional[int] = ..., type: _Optional[_Union[KvEventType, str]] = ..., executor_id: _Optional[str] = ..., block_id: _Optional[int] = ..., block_hash: _Optional[bytes] = ..., parent_block_hash: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., num_blocks: _Optional[int] = ..., block_size: _Optional[int] = ...) -> None: ...

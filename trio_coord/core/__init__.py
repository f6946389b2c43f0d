"""The pure core: group state machine, assignors, fencing rules and records.

Nothing here imports trio, sockets, kazoo or a clock (a test scans the imports
to keep it so). Functions take the time as an argument and return decisions;
the broker carries them out. This is the sans-IO shape of h11 and wsproto.
"""

from .assignors import ASSIGNORS, Assignment, Assignor, GroupSpec, MemberSpec, choose_assignor
from .fencing import STANDALONE_GENERATION, check_commit, check_heartbeat, check_member
from .group import (
    OFFSET_RESET_POLICIES,
    TRANSITIONS,
    AssignmentPlan,
    Fence,
    Group,
    GroupLimits,
    GroupState,
    IllegalTransitionError,
    Member,
    StartPlan,
)
from .records import (
    GroupRecord,
    GroupTombstone,
    MemberRecord,
    OffsetRecord,
    Record,
    TopicRecord,
    decode_record,
    encode_record,
)
from .validation import validate_group_id, validate_topic_name

__all__ = [
    "ASSIGNORS",
    "OFFSET_RESET_POLICIES",
    "STANDALONE_GENERATION",
    "TRANSITIONS",
    "Assignment",
    "AssignmentPlan",
    "Assignor",
    "Fence",
    "Group",
    "GroupLimits",
    "GroupRecord",
    "GroupSpec",
    "GroupState",
    "GroupTombstone",
    "IllegalTransitionError",
    "Member",
    "MemberRecord",
    "MemberSpec",
    "OffsetRecord",
    "Record",
    "StartPlan",
    "TopicRecord",
    "check_commit",
    "check_heartbeat",
    "check_member",
    "choose_assignor",
    "decode_record",
    "encode_record",
    "validate_group_id",
    "validate_topic_name",
]

"""Every torch-internal name ddpdoctor reaches, in one package split by concern, with the check
that this torch has them (:func:`contract_problems`): ``c10d``, ``ddp``, ``launchers``,
``compiler``; ``versions`` holds every release a behaviour changed at, ``loading`` how the
launcher's own process imports torch. Callers use this package's names.

A new torch release is this package and ``tests/unit/test_torch_contract.py``: c10d's private
maps and helpers, the backend-registration methods of ``ProcessGroup``, the flight-recorder
dump functions, DDP's forward and join hooks, its Reducer's group and logging data, a
backend's own sequence number, ``mp.spawn``'s and the elastic agent's internals, Dynamo's skip
list, and what the launcher's own process takes from torch (torchrun's parser, the store
client). Modules elsewhere patch or call what this package hands them and name no private torch
attribute themselves (``tests/unit/test_layers.py`` flags any underscored attribute that the
package does not define, wherever else it appears). Two tables of torch's names are data
the trace readers use too, and stay with them: the ``ProcessGroup`` methods the recording
group overrides (torch's own virtual-method names, with each op in ``trace/ops.py``) and the
torch functions whose frames label a DDP collective (``trace/ddp_sites.py``); the contract
test checks both with the rest.

torch is imported inside the functions, never at import: this package is imported in every
Python process of the job, most of which never import torch (light standard-library modules
only at import).
"""

from __future__ import annotations

from ddpdoctor.runtime.torch_internals.c10d import (  # noqa: F401
    FLIGHT_RECORDER_DUMPS,
    attach_backend,
    default_group,
    default_store,
    flight_recorder_dump,
    name_group_backend,
    set_timeout,
    start_sequence_numbers,
    store_client,
    store_server,
    work_from_future,
)
from ddpdoctor.runtime.torch_internals.compiler import (  # noqa: F401
    DYNAMO_MODULE,
    hide_from_compiler,
)
from ddpdoctor.runtime.torch_internals.contract import (  # noqa: F401
    contract_problems,
)
from ddpdoctor.runtime.torch_internals.ddp import (  # noqa: F401
    BACKEND_SEQUENCE,
    BROADCAST_COALESCED,
    BUCKET_ASSIGNMENT,
    DDP_BUCKET_CHANGERS,
    DDP_LOGGING_DATA,
    DDP_POST_FORWARD,
    DDP_PRE_FORWARD,
    JOIN_MAIN_HOOK,
    REDUCER_GROUP,
    autograd_callback_queue,
    broadcast_coalesced,
    ddp_classes,
    ddp_logging_data,
    engine_will_execute,
    grad_accumulator,
    move_reducer,
    per_backward_buckets,
    sequence_counter,
)
from ddpdoctor.runtime.torch_internals.launchers import (  # noqa: F401
    AGENT_MODULE,
    AGENT_POLL,
    SPAWN_MODULE,
    SPAWN_WRAP,
    TORCHRUN_ENTRY,
    TORCHRUN_ENTRY_QUICK_EXIT,
    TORCHRUN_ENV_ACTIONS,
    TORCHRUN_ENV_PREFIX,
    TORCHRUN_MODULE,
    agent_process_context,
    agent_return_channel,
    parser_options,
    spawn_module,
    torchrun_env_action,
    torchrun_parser,
    torchrun_parser_sources,
)
from ddpdoctor.runtime.torch_internals.loading import (  # noqa: F401
    import_quietly,
)
from ddpdoctor.runtime.torch_internals.versions import (  # noqa: F401
    GLOO_FLIGHT_RECORDER,
    SEQUENCE_NUMBERS_START_AT_ZERO,
    VERIFIED,
    minor,
    supported,
)

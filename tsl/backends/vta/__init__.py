from ...backend import Backend


class VTABackend(Backend):
    name = "vta"
    default_machine = "vta-1x16x16"


backend = VTABackend()

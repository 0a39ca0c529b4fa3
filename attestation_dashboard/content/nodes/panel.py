import horizon
from django.utils.translation import gettext_lazy as _


class Nodes(horizon.Panel):
    name = _("Nodes")
    slug = "attestation_nodes"
    policy_rules = (("attestation", "attestation:node:list"),)

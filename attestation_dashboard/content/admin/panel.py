import horizon
from django.utils.translation import gettext_lazy as _


class Attestation(horizon.Panel):
    name = _("Attestation")
    slug = "attestation"
    permissions = ("openstack.roles.admin",)
    policy_rules = (("attestation", "attestation:all_projects"),)

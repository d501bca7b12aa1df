"""The local cluster: the product's real loop on one machine, for the demo and the end-to-end tests.

Needs the ``local`` extra (``pip install 'compilecache-operator[local]'``: kmock, cryptography).
Modules: ``apiserver`` (the Kubernetes API emulator, kmock with the gaps filled), ``server``
(serving it on a port), ``client`` (a small sync client), ``admission`` (MutatingWebhookConfigurations
called as kube-apiserver calls them), ``nodes`` (simulated GPU nodes), ``jobrunner`` (the Job
controller, scheduler and volume binder), ``pods`` (the kubelet: containers as local processes),
``dns`` (multi-host pods' host names and ports on one machine), ``validation`` (what the API server
refuses), ``certs`` (the webhook's TLS), ``cluster`` (all of it in one object, and the operator beside it).

The controller never imports this package (``tests/test_layout.py``).
"""

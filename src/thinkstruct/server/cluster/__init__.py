"""Replicas on Ray Serve: ``thinkstruct serve --replicas N`` (optional extra ``thinkstruct[cluster]``).

An ingress deployment runs the same FastAPI app as the single process (validation, chat
templates, errors, the page) over a :class:`~.remote_engine.RemoteEngine`: an engine-like
object whose requests go, through a ``DeploymentHandle`` and Ray Serve's streaming, to an
engine deployment of N replicas (:mod:`.replica`), each with its own engine and grammar
compiler. Ray Serve routes each request with :class:`~.router.PromptPrefixRouter` (a
replica that holds the prompt's longest token prefix, :mod:`.prefix_index`, unless it is
busier than the least busy one by more than :mod:`.affinity`'s load bound). :mod:`.service`
starts or joins the Ray cluster and runs both.
"""
